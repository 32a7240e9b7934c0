//! A user's requests served at a lower CPU priority (`TestServer::set_user_nice`), as the bench
//! serves its load generator's, while everyone else's are served as before.

mod common;

use common::{bounded, Client};
use kube_testserver::{Options, Rule, TestServer};

const PODS: &str = "/api/v1/namespaces/default/pods";

/// The niceness of a thread's `stat` file: field 19, counted after the command's parenthesis.
fn niceness(stat: &std::path::Path) -> Option<i64> {
    let s = std::fs::read_to_string(stat).ok()?;
    let (_, rest) = s.rsplit_once(')')?;
    rest.split_whitespace().nth(16)?.parse().ok()
}

/// How many threads of this process (the server's among them) run at a higher niceness than
/// the calling one: the tests may run under `nice` themselves.
fn threads_below_us() -> usize {
    let ours = niceness("/proc/thread-self/stat".as_ref()).expect("our niceness");
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| niceness(&t.ok()?.path().join("stat")))
        .filter(|n| *n > ours)
        .count()
}

#[test]
fn a_users_connection_is_served_at_its_niceness_and_the_others_are_not() {
    bounded(30, || {
        let server = TestServer::start(Options::default()).expect("server");
        server.add_user("load", "load-token", vec![Rule::new(&["*"], &["*"])]);
        server.set_user_nice("load", 15);
        assert_eq!(
            threads_below_us(),
            0,
            "no thread is reniced before a request"
        );

        // Each client keeps its connection open (keep-alive), so its server thread stays.
        let load = Client::new(&server, "load-token");
        assert_eq!(load.get(PODS).code, 200);
        let admin = Client::admin(&server);
        assert_eq!(admin.get(PODS).code, 200);
        assert_eq!(load.get(PODS).code, 200);

        assert_eq!(
            threads_below_us(),
            1,
            "one thread serves the load user's connection"
        );
    });
}
