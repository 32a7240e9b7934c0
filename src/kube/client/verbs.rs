//! The verbs: GET, POST, PUT, PATCH and DELETE of objects, LIST pages and WATCH streams.

use super::*;

impl Client {
    fn send_json<B: Serialize, T: DeserializeOwned>(
        &self,
        method: &'static str,
        path: &str,
        content_type: &'static str,
        body: &B,
    ) -> Result<T, Error> {
        let body = serde_json::to_vec(body).map_err(|e| Error::Decode(e.to_string()))?;
        self.json(&Req::new(method, path, Some((content_type, &body))))
    }

    /// GET of any path (discovery documents), decoded as `T`.
    pub fn get_path<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        self.json(&Req::new("GET", path, None))
    }

    pub fn get_pod(&self, ns: &str, name: &str) -> Result<Pod, Error> {
        self.get_object(Resource::PODS, ns, name)
    }

    pub fn create_pod(&self, ns: &str, pod: &Pod) -> Result<Pod, Error> {
        self.create(Resource::PODS, ns, pod)
    }

    /// POST of a pod, answered with the pod and the whole spec the API server stored, which
    /// tells what of the spec sent it did not keep (a decoded [`Pod`] keeps only what we compare).
    pub fn create_pod_stored(&self, ns: &str, pod: &Pod) -> Result<CreatedPod, Error> {
        let answer: serde_json::Value = self.create(Resource::PODS, ns, pod)?;
        let spec = answer["spec"].clone();
        let created: Pod = serde_json::from_value(answer)
            .map_err(|e| Error::Decode(format!("POST pod {}: {e}", pod.metadata.name)))?;
        Ok(CreatedPod { pod: created, spec })
    }

    /// Deletes a pod only if it still has `uid`, and answers the pod as the server left it (see
    /// [`Pod::is_removed`]); an answer that is not a pod reads as "not known to be removed".
    pub fn delete_pod(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        grace: Option<u32>,
    ) -> Result<Pod, Error> {
        let body = delete_body(uid, grace);
        let path = object_path(Resource::PODS, ns, name);
        match self.json(&Req::new("DELETE", &path, Some((JSON, body.as_bytes())))) {
            Err(Error::Decode(_)) => Ok(Pod::default()),
            other => other,
        }
    }

    /// Strategic merge patch of a pod (its `$deleteFromPrimitiveList` removes one finalizer
    /// without touching others'); a `metadata.uid` in it keeps it off another pod of the name.
    pub fn patch_pod(&self, ns: &str, name: &str, patch: &serde_json::Value) -> Result<Pod, Error> {
        let path = object_path(Resource::PODS, ns, name);
        let strategic = "application/strategic-merge-patch+json";
        self.send_json("PATCH", &path, strategic, patch)
    }

    /// JSON merge patch of an object's `/status`: custom resources refuse strategic merge patch.
    pub fn patch_status<T: DeserializeOwned>(
        &self,
        res: Resource,
        ns: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<T, Error> {
        let path = format!("{}/status", object_path(res, ns, name));
        self.send_json("PATCH", &path, "application/merge-patch+json", patch)
    }

    /// POST of any object to a namespaced collection (events, leases), decoded as `T`.
    pub fn create<B: Serialize, T: DeserializeOwned>(
        &self,
        res: Resource,
        ns: &str,
        body: &B,
    ) -> Result<T, Error> {
        self.send_json("POST", &collection_path(res, Some(ns)), JSON, body)
    }

    /// POST of any object to a cluster-scoped collection (token and access reviews).
    pub fn create_cluster_scoped<B: Serialize, T: DeserializeOwned>(
        &self,
        res: Resource,
        body: &B,
    ) -> Result<T, Error> {
        self.send_json("POST", &collection_path(res, None), JSON, body)
    }

    pub fn get_object<T: DeserializeOwned>(
        &self,
        res: Resource,
        ns: &str,
        name: &str,
    ) -> Result<T, Error> {
        self.get_path(&object_path(res, ns, name))
    }

    /// PUT (replace) of a namespaced object; the body's resourceVersion makes it conditional.
    pub fn replace<B: Serialize, T: DeserializeOwned>(
        &self,
        res: Resource,
        ns: &str,
        name: &str,
        body: &B,
    ) -> Result<T, Error> {
        self.send_json("PUT", &object_path(res, ns, name), JSON, body)
    }

    pub fn merge_patch<B: Serialize, T: DeserializeOwned>(
        &self,
        res: Resource,
        ns: &str,
        name: &str,
        patch: &B,
    ) -> Result<T, Error> {
        let path = object_path(res, ns, name);
        self.send_json("PATCH", &path, "application/merge-patch+json", patch)
    }

    pub fn list<T: DeserializeOwned>(
        &self,
        res: Resource,
        ns: Option<&str>,
        params: &ListParams,
    ) -> Result<ListPage<T>, Error> {
        self.get_path(&(collection_path(res, ns) + &list_query(params)))
    }

    /// One page of a LIST of the objects' metadata only (see [`METADATA_LIST`]).
    pub fn list_metadata(
        &self,
        res: Resource,
        ns: Option<&str>,
        params: &ListParams,
    ) -> Result<ListPage<crate::kube::types::PartialObjectMetadata>, Error> {
        let path = collection_path(res, ns) + &list_query(params);
        self.json(&Req {
            accept: METADATA_LIST,
            ..Req::new("GET", &path, None)
        })
    }

    /// Opens a WATCH: one JSON event per line, each read bounded as [`WatchBody`] says.
    pub fn watch(
        &self,
        res: Resource,
        ns: Option<&str>,
        params: &WatchParams,
    ) -> Result<Box<dyn BufRead + Send>, Error> {
        let path = collection_path(res, ns) + &watch_query(params);
        let timeout = Duration::from_secs(params.timeout_seconds as u64) + WATCH_GRACE;
        let idle = match params.idle_timeout {
            d if d.is_zero() => timeout,
            d => d.min(timeout),
        };
        let resp = self.send(&Req {
            timeout,
            idle: Some(idle),
            ..Req::new("GET", &path, None)
        })?;
        let deadline = self.cut(Instant::now() + timeout);
        // A TLS record's worth: the reader below never hands over more at once.
        Ok(Box::new(BufReader::with_capacity(
            16 * 1024,
            WatchBody {
                inner: Box::new(resp.into_body().into_reader()),
                deadline,
                idle,
            },
        )))
    }
}

/// What [`Client::create_pod_stored`] answers: the pod created, and its spec as stored.
#[derive(Debug, Clone)]
pub struct CreatedPod {
    pub pod: Pod,
    pub spec: serde_json::Value,
}

/// A watch's body: a read that waited `idle` is `TimedOut`, and none starts after `deadline`.
pub(super) struct WatchBody {
    pub(super) inner: Box<dyn Read + Send + Sync>,
    pub(super) deadline: Instant,
    pub(super) idle: Duration,
}

impl Read for WatchBody {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if Instant::now() >= self.deadline {
            return Err(std::io::Error::other(
                "the watch outlived its timeoutSeconds and grace",
            ));
        }
        self.inner.read(buf).map_err(|e| {
            if !is_timeout(&e) {
                return e;
            }
            let silence = format!("nothing heard for {:?}", self.idle);
            std::io::Error::new(std::io::ErrorKind::TimedOut, silence)
        })
    }
}
