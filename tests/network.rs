//! End-to-end tests of how the operator reaches the API server, and what it says when the
//! kubeconfig's TLS settings or server address are wrong. They run against the test API server,
//! or a real cluster with IMMORTAL_E2E_KUBECONFIG: the kubeconfigs are edited copies of its own.

mod common;

use common::{Cluster, Operator};
use std::time::Duration;

const TLS_FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tls");

/// How long a configuration error may take to end the operator: well under the 30 s for which
/// start-up retries a server it cannot reach, which is what these were taken for before.
const AT_ONCE: Duration = Duration::from_secs(20);

/// Starts the operator on `kubeconfig` and waits for it to exit: its exit code, and its log.
fn exit_of(c: &Cluster, kubeconfig: &std::path::Path) -> (Option<i32>, String) {
    let mut op = Operator::start_as(c, kubeconfig, &[], "operator.log");
    let status = op
        .wait_exit(c.timeout(AT_ONCE))
        .unwrap_or_else(|| panic!("still running:\n{}", op.log_tail(20)));
    (status.code(), op.log_tail(20))
}

#[test]
fn a_certificate_authority_that_does_not_verify_the_server_ends_the_operator_naming_the_field() {
    let c = Cluster::new("wrong-ca");
    let kubeconfig = c.edited_kubeconfig("wrong-ca.kubeconfig", |cluster| {
        cluster.remove("certificate-authority-data");
        cluster.remove("insecure-skip-tls-verify");
        let ca = format!("{TLS_FIXTURES}/other-ca.crt");
        cluster.insert("certificate-authority".into(), ca.into());
    });
    let (code, log) = exit_of(&c, &kubeconfig);
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("certificate-authority ")
            && log.contains("other-ca.crt")
            && log.contains("does not verify"),
        "{log}"
    );
    assert!(!log.contains("cannot reach"), "{log}");
}

#[test]
fn a_malformed_server_url_ends_the_operator_naming_the_field() {
    let c = Cluster::new("bad-server-url");
    let kubeconfig = c.edited_kubeconfig("bad-server.kubeconfig", |cluster| {
        cluster.insert("server".into(), "https://exa mple.invalid:6443".into());
    });
    let (code, log) = exit_of(&c, &kubeconfig);
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("server \"https://exa mple.invalid:6443\" is not a valid URL"),
        "{log}"
    );
}
