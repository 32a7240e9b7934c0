//! Where a watcher gets its lists and streams, and where one watched resource lives.

use crate::kube::client::{self, Client, ListPage, ListParams, Resource, WatchParams};
use serde::de::DeserializeOwned;
use std::io::BufRead;
use std::time::Duration;

/// Page size of a relist: bounds the memory a large one takes.
const LIST_PAGE: u32 = 500;

/// Where one watched resource lives.
#[derive(Clone, Debug)]
pub struct Kind {
    pub resource: Resource,
    /// Watch one namespace, or all when `None`.
    pub namespace: Option<String>,
    pub label_selector: Option<String>,
    /// What a 404 means for this resource and what to do about it (a CRD deleted under us).
    pub if_missing: Option<&'static str>,
}

/// Where a watcher gets its lists and streams: the API client, or a script in tests.
pub trait Source {
    fn list_page<T: DeserializeOwned>(
        &self,
        kind: &Kind,
        continue_token: Option<&str>,
    ) -> Result<ListPage<T>, client::Error>;
    /// The server's resourceVersion now, as the list of one object of `kind` answers it.
    fn version(&self, kind: &Kind) -> Result<String, client::Error>;
    /// A watch heard nothing for its idle limit: drop the connections that share its path.
    fn connections_dead(&self) {}
    /// A stream that hears nothing for `idle` must fail its read with `TimedOut`.
    fn watch(
        &self,
        kind: &Kind,
        rv: &str,
        timeout_secs: u32,
        idle: Duration,
    ) -> Result<Box<dyn BufRead + Send>, client::Error>;
}

impl Source for Client {
    fn connections_dead(&self) {
        self.forget_connections();
    }

    fn version(&self, kind: &Kind) -> Result<String, client::Error> {
        let params = ListParams {
            label_selector: kind.label_selector.as_deref(),
            limit: Some(1),
            continue_token: None,
        };
        let page: ListPage<serde::de::IgnoredAny> =
            self.list(kind.resource, kind.namespace.as_deref(), &params)?;
        Ok(page.metadata.resource_version)
    }

    fn list_page<T: DeserializeOwned>(
        &self,
        kind: &Kind,
        continue_token: Option<&str>,
    ) -> Result<ListPage<T>, client::Error> {
        let params = ListParams {
            label_selector: kind.label_selector.as_deref(),
            limit: Some(LIST_PAGE),
            continue_token,
        };
        self.list(kind.resource, kind.namespace.as_deref(), &params)
    }

    fn watch(
        &self,
        kind: &Kind,
        rv: &str,
        timeout_secs: u32,
        idle: Duration,
    ) -> Result<Box<dyn BufRead + Send>, client::Error> {
        let params = WatchParams {
            label_selector: kind.label_selector.as_deref(),
            resource_version: rv,
            timeout_seconds: timeout_secs,
            idle_timeout: idle,
        };
        Client::watch(self, kind.resource, kind.namespace.as_deref(), &params)
    }
}
