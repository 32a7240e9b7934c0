//! Test helpers: reading the responses recorded from real kube-apiservers: the node-less
//! `kube-apiserver` set, and the `kube-1.28-kubelet` set from a cluster with a node.

const APISERVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/kube-apiserver");
const KUBELET: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/kube-1.28-kubelet"
);

/// The response of the recorded fixture (node-less set) whose file name contains `name`:
/// status code and body.
pub fn fixture(name: &str) -> (u16, String) {
    fixture_in(APISERVER, name)
}

/// The events of a watch recorded on the cluster with a kubelet, one JSON line each.
pub fn kubelet_events(name: &str) -> Vec<String> {
    events(fixture_in(KUBELET, name).1)
}

/// A response recorded on the cluster with a kubelet: status code and body.
pub fn kubelet_fixture(name: &str) -> (u16, String) {
    fixture_in(KUBELET, name)
}

fn fixture_in(dir: &str, name: &str) -> (u16, String) {
    let path = std::fs::read_dir(dir)
        .expect("fixtures directory")
        .map(|e| e.expect("dir entry").path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains(name))
        })
        .unwrap_or_else(|| panic!("no fixture named like {name}"));
    let text = std::fs::read_to_string(path).expect("fixture readable");
    let resp = &text[text.find("### response").expect("response section")..];
    let status_line = resp.lines().nth(1).expect("status line");
    let code = status_line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code");
    // Headers end with a blank line; the files mix CRLF (as recorded) and LF.
    let end = [
        resp.find("\r\n\r\n").map(|i| i + 4),
        resp.find("\n\n").map(|i| i + 2),
    ]
    .into_iter()
    .flatten()
    .min()
    .expect("end of headers");
    (code, resp[end..].to_string())
}

/// The events of a recorded watch stream, one JSON line each.
pub fn fixture_events(name: &str) -> Vec<String> {
    events(fixture(name).1)
}

fn events(body: String) -> Vec<String> {
    body.lines()
        .map(str::trim)
        .filter(|l| l.starts_with('{'))
        .map(String::from)
        .collect()
}

/// A client of the cluster a kubeconfig file names, with two connections.
pub fn client_of(kubeconfig: &std::path::Path) -> crate::kube::client::Client {
    let opts = crate::kube::config::LoadOptions {
        kubeconfig: Some(kubeconfig.to_path_buf()),
        context: None,
    };
    crate::kube::client::Client::new(crate::kube::config::load(&opts).unwrap(), 2).unwrap()
}

/// A test API server that knows a metrics reader (token `reader`, may get /metrics) and a
/// stranger (token `nobody`, may do nothing), besides its admin.
pub fn server_with_metrics_reader() -> kube_testserver::TestServer {
    use kube_testserver::{Options, Rule, TestServer};
    let server = TestServer::start(Options::default()).unwrap();
    server.add_user(
        "prometheus",
        "reader",
        vec![Rule::new(&["get"], &["/metrics"])],
    );
    server.add_user("nobody", "nobody", vec![]);
    server
}
