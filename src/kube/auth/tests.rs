//! Tests of credentials: tokens, token files, exec plugins and client certificates.

use super::*;
use crate::kube::config::tests::{b64_fixture, empty_env, kubeconfig, with_file, TempDir};
use crate::kube::config::{load_with_env, ClusterConfig, LoadOptions};
use crate::kube::tls::tests::{fixture, get, one_shot_server};
use std::os::unix::fs::PermissionsExt;

/// Serializes the tests that write and run plugin scripts: a script still open for writing
/// in a process forked by another test thread cannot be executed ("text file busy").
static PLUGIN_LOCK: Mutex<()> = Mutex::new(());

/// A fake plugin: counts its runs, records its environment and arguments, prints
/// `response.json` and exits with `exit-code`, all in its directory.
const PLUGIN: &str = r#"#!/bin/sh
dir="$PLUGIN_DIR"
n=$(cat "$dir/count" 2>/dev/null || echo 0)
echo $((n + 1)) > "$dir/count"
printf '%s' "$KUBERNETES_EXEC_INFO" > "$dir/exec-info"
printf '%s\n' "$@" > "$dir/args"
cat "$dir/response.json"
exit "$(cat "$dir/exit-code" 2>/dev/null || echo 0)"
"#;

struct Plugin {
    dir: TempDir,
    kubeconfig: PathBuf,
}

impl Plugin {
    /// A kubeconfig whose user runs `./bin/plugin` (relative to the kubeconfig) with
    /// `api_version`; `extra` adds exec fields, `cluster` cluster fields.
    fn new(api_version: &str, extra: &str, cluster: &str) -> Plugin {
        let dir = TempDir::new("exec");
        let script = dir.write("kube/bin/plugin", PLUGIN);
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let user = format!(
            "    exec:
      apiVersion: {api_version}
      command: ./bin/plugin
      args: [--flag, value]
      env:
      - name: PLUGIN_DIR
        value: {}
      installHint: null
{extra}",
            dir.0.display()
        );
        let kubeconfig = dir.write(
            "kube/config",
            kubeconfig("https://127.0.0.1:6443", cluster, &user),
        );
        Plugin { dir, kubeconfig }
    }

    fn respond(&self, api_version: &str, status: serde_json::Value) {
        let body = serde_json::json!({
            "apiVersion": api_version, "kind": "ExecCredential", "status": status,
        });
        self.dir.write("response.json", body.to_string());
    }

    fn runs(&self) -> u32 {
        std::fs::read_to_string(self.dir.0.join("count"))
            .map(|s| s.trim().parse().unwrap())
            .unwrap_or(0)
    }

    fn load(&self) -> ClusterConfig {
        load_with_env(&with_file(&self.kubeconfig), &empty_env(&self.dir)).unwrap()
    }

    fn exec_info(&self) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(self.dir.0.join("exec-info")).unwrap())
            .unwrap()
    }
}

const V1: &str = "client.authentication.k8s.io/v1";
const V1BETA1: &str = "client.authentication.k8s.io/v1beta1";

use crate::util::rfc3339;

#[test]
fn exec_v1_token_is_cached_until_invalidated() {
    let _guard = lock(&PLUGIN_LOCK);
    let plugin = Plugin::new(V1, "      interactiveMode: IfAvailable", "");
    let in_an_hour = rfc3339(SystemTime::now() + Duration::from_secs(3600));
    plugin.respond(
        V1,
        serde_json::json!({"token": "tok-1", "expirationTimestamp": in_an_hour}),
    );
    let config = plugin.load();
    assert_eq!(
        plugin.runs(),
        0,
        "the plugin runs only when a credential is needed"
    );

    for _ in 0..3 {
        assert_eq!(
            config.credentials.authorization().unwrap().as_deref(),
            Some("Bearer tok-1")
        );
    }
    assert_eq!(plugin.runs(), 1);

    plugin.respond(
        V1,
        serde_json::json!({"token": "tok-2", "expirationTimestamp": in_an_hour}),
    );
    config.credentials.invalidate();
    assert_eq!(
        config.credentials.authorization().unwrap().as_deref(),
        Some("Bearer tok-2")
    );
    assert_eq!(plugin.runs(), 2);

    let args = std::fs::read_to_string(plugin.dir.0.join("args")).unwrap();
    assert_eq!(args, "--flag\nvalue\n");
    assert_eq!(
        plugin.exec_info(),
        serde_json::json!({"apiVersion": V1, "kind": "ExecCredential", "spec": {"interactive": false}})
    );
}

#[test]
fn exec_v1beta1_token_is_refreshed_once_expired() {
    let _guard = lock(&PLUGIN_LOCK);
    let plugin = Plugin::new(V1BETA1, "", "");
    plugin.respond(
        V1BETA1,
        serde_json::json!({"token": "old", "expirationTimestamp": "2020-01-01T00:00:00Z"}),
    );
    let config = plugin.load();
    config.credentials.authorization().unwrap();
    config.credentials.authorization().unwrap();
    assert_eq!(plugin.runs(), 2, "an expired credential is never reused");
    assert_eq!(plugin.exec_info()["apiVersion"], V1BETA1);
}

#[test]
fn exec_token_expiring_within_the_margin_is_refreshed() {
    let _guard = lock(&PLUGIN_LOCK);
    let plugin = Plugin::new(V1, "", "");
    let soon = rfc3339(SystemTime::now() + EXEC_EXPIRY_MARGIN / 2);
    plugin.respond(
        V1,
        serde_json::json!({"token": "t", "expirationTimestamp": soon}),
    );
    let config = plugin.load();
    config.credentials.authorization().unwrap();
    config.credentials.authorization().unwrap();
    assert_eq!(plugin.runs(), 2);
}

#[test]
fn exec_token_without_expiry_is_kept_until_invalidated() {
    let _guard = lock(&PLUGIN_LOCK);
    let plugin = Plugin::new(V1, "", "");
    plugin.respond(V1, serde_json::json!({"token": "forever"}));
    let config = plugin.load();
    for _ in 0..3 {
        config.credentials.authorization().unwrap();
    }
    assert_eq!(plugin.runs(), 1);
    config.credentials.invalidate();
    config.credentials.authorization().unwrap();
    assert_eq!(plugin.runs(), 2);
}

#[test]
fn exec_client_certificate_is_presented_and_replaced_after_invalidate() {
    let _guard = lock(&PLUGIN_LOCK);
    let plugin = Plugin::new(
        V1,
        "",
        &format!("    certificate-authority-data: {}", b64_fixture("ca.crt")),
    );
    let pem = |name: &str| String::from_utf8(fixture(name)).unwrap();
    plugin.respond(
        V1,
        serde_json::json!({
            "clientCertificateData": pem("client-ec.crt"), "clientKeyData": pem("client-ec.key"),
        }),
    );
    let config = plugin.load();
    assert_eq!(config.credentials.authorization().unwrap(), None);

    let first = config.tls_config().unwrap();
    assert!(
        Arc::ptr_eq(&first, &config.tls_config().unwrap()),
        "unchanged certificate, same config"
    );
    let (port, rx) = one_shot_server("server.crt", "server.key", true);
    assert_eq!(get(first.clone(), "127.0.0.1", port).unwrap(), "ok");
    let seen = rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap()
        .unwrap();
    use rustls::pki_types::pem::PemObject;
    let ec_der =
        rustls::pki_types::CertificateDer::from_pem_slice(&fixture("client-ec.crt")).unwrap();
    assert_eq!(seen, ec_der.to_vec());

    plugin.respond(
        V1,
        serde_json::json!({
            "clientCertificateData": pem("client-rsa.crt"), "clientKeyData": pem("client-rsa.key"),
        }),
    );
    config.credentials.invalidate();
    let second = config.tls_config().unwrap();
    assert!(
        !Arc::ptr_eq(&first, &second),
        "a new certificate needs a new agent"
    );
    assert_eq!(plugin.runs(), 2);
}

#[test]
fn exec_plugin_gets_cluster_info_when_asked() {
    let _guard = lock(&PLUGIN_LOCK);
    let plugin = Plugin::new(
        V1,
        "      provideClusterInfo: true",
        &format!(
            "    certificate-authority-data: {}
    tls-server-name: kubernetes.test
    extensions:
    - name: client.authentication.k8s.io/exec
      extension: {{audience: operators}}",
            b64_fixture("ca.crt")
        ),
    );
    plugin.respond(V1, serde_json::json!({"token": "t"}));
    plugin.load().credentials.authorization().unwrap();
    let cluster = &plugin.exec_info()["spec"]["cluster"];
    assert_eq!(cluster["server"], "https://127.0.0.1:6443");
    assert_eq!(cluster["tls-server-name"], "kubernetes.test");
    assert_eq!(cluster["certificate-authority-data"], b64_fixture("ca.crt"));
    assert_eq!(
        cluster["config"],
        serde_json::json!({"audience": "operators"})
    );
}

#[test]
fn failing_plugin_is_an_error_and_is_retried_on_the_next_call() {
    let _guard = lock(&PLUGIN_LOCK);
    let plugin = Plugin::new(V1, "", "");
    plugin.respond(V1, serde_json::json!({"token": "s3cr3t"}));
    plugin.dir.write("exit-code", "3");
    let config = plugin.load();
    let text = config.credentials.authorization().unwrap_err().to_string();
    assert_eq!(
        text,
        format!(
            "kubeconfig {}, user \"test-user\", exec: exec plugin {:?} failed: exit status: 3",
            plugin.kubeconfig.display(),
            plugin.dir.0.join("kube/bin/plugin").display().to_string()
        )
    );
    std::fs::remove_file(plugin.dir.0.join("exit-code")).unwrap();
    assert_eq!(
        config.credentials.authorization().unwrap().as_deref(),
        Some("Bearer s3cr3t")
    );
    assert_eq!(plugin.runs(), 2);
}

#[test]
fn plugin_answering_another_api_version_is_refused() {
    let _guard = lock(&PLUGIN_LOCK);
    let plugin = Plugin::new(V1, "", "");
    plugin.respond(V1BETA1, serde_json::json!({"token": "t"}));
    let text = plugin
        .load()
        .credentials
        .authorization()
        .unwrap_err()
        .to_string();
    assert!(
        text.ends_with(&format!("returned apiVersion {V1BETA1:?}, expected {V1:?}")),
        "{text}"
    );
}

#[test]
fn plugin_output_problems_are_named_without_echoing_secrets() {
    let _guard = lock(&PLUGIN_LOCK);
    let plugin = Plugin::new(V1, "", "");
    let config = plugin.load();
    let cases = [
        (
            serde_json::json!({"token": 987654321}),
            "invalid ExecCredential: invalid type: integer `...`, expected a string",
        ),
        (
            serde_json::json!({}),
            "returned neither a token nor a client certificate",
        ),
        (
            serde_json::json!({"clientKeyData": "s3cr3t"}),
            "returned only one of clientCertificateData and clientKeyData",
        ),
        (
            serde_json::json!({"token": "s3cr3t", "expirationTimestamp": "tomorrow"}),
            "returned an invalid expirationTimestamp \"tomorrow\"",
        ),
    ];
    for (status, expected) in cases {
        plugin.respond(V1, status);
        let text = config.credentials.authorization().unwrap_err().to_string();
        assert!(text.contains(expected), "{text}");
        assert!(
            !text.contains("s3cr3t") && !text.contains("987654321"),
            "{text}"
        );
    }
    plugin.dir.write(
        "response.json",
        r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential"}"#,
    );
    let text = config.credentials.authorization().unwrap_err().to_string();
    assert!(text.ends_with("returned no status"), "{text}");
}

#[test]
fn missing_plugin_says_not_found_with_the_install_hint() {
    let dir = TempDir::new("no-plugin");
    let user = "    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: immortal-test-no-such-plugin
      installHint: install it from example.com";
    let path = dir.write("config", kubeconfig("https://127.0.0.1:6443", "", user));
    let config = load_with_env(&with_file(&path), &empty_env(&dir)).unwrap();
    let text = config.credentials.authorization().unwrap_err().to_string();
    assert_eq!(
            text,
            format!(
                "kubeconfig {}, user \"test-user\", exec: exec plugin \"immortal-test-no-such-plugin\" not found (install it from example.com)",
                path.display()
            )
        );
    assert!(
        config.tls_config().is_err(),
        "tls_config also needs the plugin"
    );
}

#[test]
fn unsupported_exec_settings_are_refused_at_load() {
    let dir = TempDir::new("exec-settings");
    let load = |exec: &str| {
        let path = dir.write("config", kubeconfig("https://127.0.0.1:6443", "", exec));
        load_with_env(&with_file(&path), &empty_env(&dir))
            .unwrap_err()
            .to_string()
    };
    let text = load("    exec: {apiVersion: client.authentication.k8s.io/v1alpha1, command: x}");
    assert!(text.ends_with("apiVersion \"client.authentication.k8s.io/v1alpha1\" is not supported (use client.authentication.k8s.io/v1 or client.authentication.k8s.io/v1beta1)"), "{text}");
    let text = load("    exec: {apiVersion: client.authentication.k8s.io/v1, command: x, interactiveMode: Always}");
    assert!(
        text.contains("interactiveMode Always needs a terminal"),
        "{text}"
    );
    let text = load("    exec: {apiVersion: client.authentication.k8s.io/v1}");
    assert!(
        text.ends_with("user \"test-user\", exec: no command set"),
        "{text}"
    );
}

#[test]
fn hung_plugin_is_killed_after_the_timeout() {
    let _guard = lock(&PLUGIN_LOCK);
    let dir = TempDir::new("hung");
    let script = dir.write("plugin", "#!/bin/sh\nexec sleep 30\n");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut credentials = Credentials::exec(ExecConfig {
        origin: "test".into(),
        command: script.into_os_string(),
        args: vec![],
        env: vec![],
        api_version: V1.into(),
        install_hint: None,
        interactive_mode: None,
        cluster: None,
    })
    .unwrap();
    if let Source::Exec(plugin) = &mut credentials.0 {
        plugin.timeout = Duration::from_millis(300);
    }
    let started = Instant::now();
    let text = credentials.authorization().unwrap_err().to_string();
    assert!(text.ends_with("did not finish within 300ms"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

fn token_file_of(config: &ClusterConfig) -> &TokenFile {
    match &config.credentials.0 {
        Source::TokenFile(file) => file,
        _ => panic!("expected a token file"),
    }
}

#[test]
fn in_cluster_token_is_reread_once_older_than_a_minute() {
    let dir = TempDir::new("rotation");
    dir.write("sa/token", "first");
    dir.write("sa/ca.crt", fixture("ca.crt"));
    let mut env = empty_env(&dir);
    env.sa_dir = dir.0.join("sa");
    env.service_host = Some("10.96.0.1".into());
    env.service_port = Some("443".into());
    let config = load_with_env(&LoadOptions::default(), &env).unwrap();
    let header = || config.credentials.authorization().unwrap().unwrap();

    dir.write("sa/token", "second\n");
    assert_eq!(header(), "Bearer first", "a fresh copy is not re-read");

    // Make the cached copy look a minute old.
    lock(&token_file_of(&config).cached).reread_at = Instant::now();
    assert_eq!(header(), "Bearer second");

    // A failed re-read keeps the token it had.
    std::fs::remove_file(dir.0.join("sa/token")).unwrap();
    config.credentials.invalidate();
    assert_eq!(header(), "Bearer second");
}

#[test]
fn empty_token_file_is_an_error() {
    let dir = TempDir::new("empty-token");
    let token = dir.write("token", "\n");
    let text = Credentials::token_file(token.clone(), "tokenFile".into())
        .unwrap_err()
        .to_string();
    assert_eq!(
        text,
        format!("tokenFile: cannot read {}: file is empty", token.display())
    );
}

#[test]
fn debug_names_the_kind_of_credential_but_not_the_secret() {
    let dir = TempDir::new("debug-creds");
    let path = dir.write("token", "s3cr3t");
    let cases = [
        (
            Credentials::token("s3cr3t".into()),
            "Credentials(token <redacted>)".to_string(),
        ),
        (
            Credentials::token_file(path.clone(), "t".into()).unwrap(),
            format!("Credentials(token file {})", path.display()),
        ),
        (Credentials::anonymous(), "Credentials(none)".to_string()),
    ];
    for (credentials, expected) in cases {
        assert_eq!(format!("{credentials:?}"), expected);
    }
}

#[test]
fn redaction_removes_quoted_values_and_keeps_the_rest() {
    assert_eq!(
        redact_values("invalid type: string \"t0k\\\"en\", expected a boolean at line 3 column 5"),
        "invalid type: string \"...\", expected a boolean at line 3 column 5"
    );
    assert_eq!(
        redact_values("invalid type: integer `12345`, expected a string"),
        "invalid type: integer `...`, expected a string"
    );
    assert_eq!(
        redact_values("missing field `name`"),
        "missing field `name`"
    );
}
