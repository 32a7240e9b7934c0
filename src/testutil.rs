//! Test helpers: reading the responses recorded from a real kube-apiserver.

/// The response of the recorded fixture whose file name contains `name`: status code and body.
pub fn fixture(name: &str) -> (u16, String) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/kube-apiserver");
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
    fixture(name)
        .1
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('{'))
        .map(String::from)
        .collect()
}
