//! kubeconfig files as kubectl writes and merges them: clusters, users and contexts, with
//! client-go's loading rules (first file wins, paths relative to their file).

use super::*;

/// A kubeconfig file as written by kubectl. Unknown fields (preferences, extensions we do not
/// use, apiVersion, kind) are ignored; lists may be null, as kubectl writes them.
#[derive(Deserialize, Default)]
pub(super) struct RawConfig {
    #[serde(default)]
    clusters: Option<Vec<Named<RawCluster>>>,
    #[serde(default)]
    users: Option<Vec<Named<RawUser>>>,
    #[serde(default)]
    contexts: Option<Vec<Named<RawContext>>>,
    #[serde(default, rename = "current-context")]
    current_context: Option<String>,
}

/// `{name, cluster|user|context}`: the body's key differs per list, so all three are accepted.
#[derive(Deserialize)]
pub(super) struct Named<T> {
    name: String,
    #[serde(default, rename = "cluster", alias = "user", alias = "context")]
    body: Option<T>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawCluster {
    server: Option<String>,
    certificate_authority: Option<String>,
    certificate_authority_data: Option<String>,
    insecure_skip_tls_verify: Option<bool>,
    tls_server_name: Option<String>,
    proxy_url: Option<String>,
    extensions: Option<Vec<RawExtension>>,
}

#[derive(Deserialize, Clone)]
pub(super) struct RawExtension {
    name: String,
    extension: Option<serde_yaml::Value>,
}

/// Deliberately not Debug: it holds tokens and keys.
#[derive(Deserialize, Default, Clone)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawUser {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<String>,
    client_certificate: Option<String>,
    client_certificate_data: Option<String>,
    client_key: Option<String>,
    client_key_data: Option<String>,
    username: Option<String>,
    password: Option<String>,
    #[serde(rename = "as")]
    impersonate: Option<String>,
    auth_provider: Option<RawAuthProvider>,
    exec: Option<RawExec>,
}

#[derive(Deserialize, Clone)]
pub(super) struct RawAuthProvider {
    name: Option<String>,
}

#[derive(Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawExec {
    command: Option<String>,
    args: Option<Vec<String>>,
    env: Option<Vec<RawEnvVar>>,
    api_version: Option<String>,
    install_hint: Option<String>,
    provide_cluster_info: Option<bool>,
    interactive_mode: Option<String>,
}

#[derive(Deserialize, Clone)]
pub(super) struct RawEnvVar {
    name: String,
    value: Option<String>,
}

#[derive(Deserialize, Default, Clone)]
pub(super) struct RawContext {
    cluster: Option<String>,
    user: Option<String>,
    namespace: Option<String>,
}

/// An entry and the file that defined it (relative paths inside resolve against its directory).
pub(super) struct Defined<T> {
    file: PathBuf,
    value: T,
}

/// The merge of one or more kubeconfig files.
pub(super) struct Merged {
    pub(super) files: Vec<PathBuf>,
    clusters: BTreeMap<String, Defined<RawCluster>>,
    users: BTreeMap<String, Defined<RawUser>>,
    contexts: BTreeMap<String, Defined<RawContext>>,
    current_context: Option<(String, PathBuf)>,
}

impl Merged {
    fn label(&self) -> String {
        let files: Vec<String> = self.files.iter().map(|f| f.display().to_string()).collect();
        format!("kubeconfig {}", files.join(":"))
    }
}

/// Reads and merges kubeconfig files the way kubectl merges KUBECONFIG: for every cluster, user
/// and context name, and for current-context, the first file that sets it wins. Missing files
/// are an error only if `must_exist`; unreadable or malformed ones always are.
pub(super) fn merge_files(paths: &[PathBuf], must_exist: bool) -> Result<Merged, ConfigError> {
    let mut merged = Merged {
        files: Vec::new(),
        clusters: BTreeMap::new(),
        users: BTreeMap::new(),
        contexts: BTreeMap::new(),
        current_context: None,
    };
    for path in paths {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound && !must_exist => continue,
            Err(error) => {
                return Err(ConfigError::Read {
                    what: "kubeconfig".into(),
                    path: path.clone(),
                    error,
                })
            }
        };
        let raw = parse_kubeconfig(&text).map_err(|error| ConfigError::Parse {
            path: path.clone(),
            error,
        })?;
        merged.files.push(path.clone());
        for c in raw.clusters.unwrap_or_default() {
            let body = c.body.unwrap_or_default();
            merged.clusters.entry(c.name).or_insert_with(|| Defined {
                file: path.clone(),
                value: body,
            });
        }
        for u in raw.users.unwrap_or_default() {
            let body = u.body.unwrap_or_default();
            merged.users.entry(u.name).or_insert_with(|| Defined {
                file: path.clone(),
                value: body,
            });
        }
        for c in raw.contexts.unwrap_or_default() {
            let body = c.body.unwrap_or_default();
            merged.contexts.entry(c.name).or_insert_with(|| Defined {
                file: path.clone(),
                value: body,
            });
        }
        if merged.current_context.is_none() {
            if let Some(current) = raw.current_context.filter(|c| !c.is_empty()) {
                merged.current_context = Some((current, path.clone()));
            }
        }
    }
    Ok(merged)
}

pub(super) fn parse_kubeconfig(text: &str) -> Result<RawConfig, String> {
    // An empty file is a valid, empty kubeconfig to kubectl; serde_yaml would call it an error.
    if text.trim().is_empty() {
        return Ok(RawConfig::default());
    }
    serde_yaml::from_str(text).map_err(|e| readable(&redact_values(&e.to_string())))
}

/// serde's message with our types' names (`expected struct RawConfig`) replaced by what the
/// file should hold there: a plain-text file given as kubeconfig must say so, not name code.
fn readable(message: &str) -> String {
    const SHAPES: [(&str, &str); 9] = [
        ("struct RawConfig", "a kubeconfig (a YAML mapping with clusters, users and contexts); is this file a kubeconfig?"),
        ("struct RawCluster", "a cluster (a mapping with server, certificate-authority, ...)"),
        ("struct RawUser", "a user (a mapping with token, client-certificate, exec, ...)"),
        ("struct RawContext", "a context (a mapping with cluster, user and namespace)"),
        ("struct RawExec", "an exec plugin (a mapping with command, args, ...)"),
        ("struct RawAuthProvider", "an auth-provider mapping"),
        ("struct RawExtension", "an extension (a mapping with name and extension)"),
        ("struct RawEnvVar", "an environment variable (a mapping with name and value)"),
        ("struct Named", "an entry (a mapping with name and cluster, user or context)"),
    ];
    SHAPES
        .iter()
        .fold(message.to_string(), |m, (ours, theirs)| {
            m.replace(ours, theirs)
        })
}

pub(super) fn from_kubeconfig(
    merged: &Merged,
    context: Option<&str>,
) -> Result<ClusterConfig, ConfigError> {
    let invalid = |origin: String, problem: String| ConfigError::Invalid { origin, problem };
    let (context_name, named_in) = match (context, &merged.current_context) {
        (Some(name), _) => (name.to_string(), merged.label()),
        (None, Some((name, file))) => (name.clone(), format!("kubeconfig {}", file.display())),
        (None, None) => {
            return Err(invalid(
                merged.label(),
                format!(
                    "no current-context set and no --context given (available: {})",
                    available(&merged.contexts)
                ),
            ))
        }
    };
    let context = merged.contexts.get(&context_name).ok_or_else(|| {
        invalid(
            named_in,
            format!(
                "context {context_name:?} not found (available: {})",
                available(&merged.contexts)
            ),
        )
    })?;
    let context_origin = format!(
        "kubeconfig {}, context {context_name:?}",
        context.file.display()
    );

    let cluster_name = context.value.cluster.as_deref().unwrap_or_default();
    if cluster_name.is_empty() {
        return Err(invalid(context_origin, "no cluster set".into()));
    }
    let cluster = merged.clusters.get(cluster_name).ok_or_else(|| {
        invalid(
            context_origin.clone(),
            format!(
                "cluster {cluster_name:?} not found (available: {})",
                available(&merged.clusters)
            ),
        )
    })?;
    let cluster_origin = format!(
        "kubeconfig {}, cluster {cluster_name:?}",
        cluster.file.display()
    );

    let server = cluster.value.server.as_deref().unwrap_or_default();
    if server.trim().is_empty() {
        return Err(invalid(cluster_origin, "no server set".into()));
    }
    let server = normalize_server(server).map_err(|p| invalid(cluster_origin.clone(), p))?;
    let insecure = cluster.value.insecure_skip_tls_verify.unwrap_or(false);
    let ca = pem_from_data_or_file(
        &cluster_origin,
        &cluster.file,
        "certificate-authority",
        cluster.value.certificate_authority_data.as_deref(),
        cluster.value.certificate_authority.as_deref(),
    )?;
    if insecure && ca.is_some() {
        // The same refusal as client-go's transport: it is unclear which one was meant.
        return Err(invalid(
            cluster_origin,
            "certificate-authority and insecure-skip-tls-verify cannot both be set".into(),
        ));
    }
    let server_name = cluster
        .value
        .tls_server_name
        .clone()
        .filter(|n| !n.is_empty())
        .map(|n| (n, format!("{cluster_origin}, tls-server-name")));

    let user_name = context.value.user.as_deref().unwrap_or_default();
    let (credentials, client) = if user_name.is_empty() {
        // A context without a user is anonymous access; kubectl allows it.
        (Credentials::anonymous(), None)
    } else {
        let user = merged.users.get(user_name).ok_or_else(|| {
            invalid(
                context_origin.clone(),
                format!(
                    "user {user_name:?} not found (available: {})",
                    available(&merged.users)
                ),
            )
        })?;
        let user_origin = format!("kubeconfig {}, user {user_name:?}", user.file.display());
        let cluster_info = ExecClusterInfo {
            server: &server,
            ca: ca.as_ref().map(|(pem, _)| pem.as_slice()),
            insecure,
            server_name: server_name.as_ref().map(|(n, _)| n.as_str()),
            extensions: cluster.value.extensions.as_deref(),
        };
        user_credentials(&user_origin, &user.file, &user.value, &cluster_info)?
    };

    let settings = TlsSettings {
        ca,
        insecure,
        server_name,
        client,
    };
    let source = format!(
        "kubeconfig {}, context {context_name}",
        context.file.display()
    );
    let namespace = context.value.namespace.clone().filter(|ns| !ns.is_empty());
    let proxy = match cluster.value.proxy_url.as_deref().filter(|u| !u.is_empty()) {
        Some(url) => Some(proxy::from_kubeconfig(url, &cluster_origin)?),
        None => None,
    };
    let mut config = finish(server, namespace, source, credentials, settings)?;
    config.proxy = proxy;
    Ok(config)
}

/// What an exec plugin may be told about the cluster (`provideClusterInfo: true`).
pub(super) struct ExecClusterInfo<'a> {
    server: &'a str,
    ca: Option<&'a [u8]>,
    insecure: bool,
    server_name: Option<&'a str>,
    extensions: Option<&'a [RawExtension]>,
}

impl ExecClusterInfo<'_> {
    /// The `spec.cluster` object of client.authentication.k8s.io ExecCredential.
    fn to_json(&self) -> serde_json::Value {
        let mut cluster = serde_json::Map::new();
        cluster.insert("server".into(), self.server.into());
        if let Some(name) = self.server_name {
            cluster.insert("tls-server-name".into(), name.into());
        }
        if self.insecure {
            cluster.insert("insecure-skip-tls-verify".into(), true.into());
        }
        if let Some(ca) = self.ca {
            cluster.insert(
                "certificate-authority-data".into(),
                base64_encode(ca).into(),
            );
        }
        // Per-cluster plugin settings live in the extension named for the exec API group.
        let config = self
            .extensions
            .unwrap_or_default()
            .iter()
            .find(|e| e.name == "client.authentication.k8s.io/exec")
            .and_then(|e| e.extension.as_ref())
            .and_then(|v| serde_json::to_value(v).ok());
        if let Some(config) = config {
            cluster.insert("config".into(), config);
        }
        serde_json::Value::Object(cluster)
    }
}

type UserCredentials = (Credentials, Option<ClientPair>);

pub(super) fn user_credentials(
    origin: &str,
    file: &Path,
    user: &RawUser,
    cluster: &ExecClusterInfo,
) -> Result<UserCredentials, ConfigError> {
    let invalid = |problem: &str| ConfigError::Invalid {
        origin: origin.to_string(),
        problem: problem.to_string(),
    };
    if let Some(provider) = &user.auth_provider {
        let name = provider.name.as_deref().unwrap_or("");
        return Err(ConfigError::Invalid {
            origin: origin.to_string(),
            problem: format!(
                "auth-provider {name:?} is not supported (it was removed from kubectl); configure an exec credential plugin instead"
            ),
        });
    }
    if user.username.is_some() || user.password.is_some() {
        return Err(invalid(
            "username/password (basic auth) is not supported; use a token, client certificate or exec plugin",
        ));
    }
    if user.impersonate.is_some() {
        return Err(invalid("impersonation (as) is not supported"));
    }

    let cert = pem_from_data_or_file(
        origin,
        file,
        "client-certificate",
        user.client_certificate_data.as_deref(),
        user.client_certificate.as_deref(),
    )?;
    let key = pem_from_data_or_file(
        origin,
        file,
        "client-key",
        user.client_key_data.as_deref(),
        user.client_key.as_deref(),
    )?;
    let client = match (cert, key) {
        (Some((cert, cert_origin)), Some((key, key_origin))) => Some(ClientPair {
            cert,
            cert_origin,
            key,
            key_origin,
        }),
        (None, None) => None,
        (Some(_), None) => return Err(invalid("client-certificate is set but client-key is not")),
        (None, Some(_)) => return Err(invalid("client-key is set but client-certificate is not")),
    };

    // A token file wins over a token (client-go: "the last successfully read value takes
    // precedence over BearerToken"), and a static token over an exec plugin (client-go's exec
    // round-tripper leaves an Authorization header that is already set alone).
    let credentials = if let Some(token_file) = user.token_file.as_deref().filter(|t| !t.is_empty())
    {
        Credentials::token_file(resolve(file, token_file), format!("{origin}, tokenFile"))?
    } else if let Some(token) = user.token.as_deref().filter(|t| !t.is_empty()) {
        Credentials::token(token.trim().to_string())
    } else if let Some(exec) = &user.exec {
        Credentials::exec(exec_config(origin, file, exec, cluster)?)?
    } else {
        Credentials::anonymous()
    };
    Ok((credentials, client))
}

pub(super) fn exec_config(
    origin: &str,
    file: &Path,
    exec: &RawExec,
    cluster: &ExecClusterInfo,
) -> Result<ExecConfig, ConfigError> {
    let origin = format!("{origin}, exec");
    let command = exec.command.as_deref().unwrap_or_default();
    if command.is_empty() {
        return Err(ConfigError::Invalid {
            origin,
            problem: "no command set".into(),
        });
    }
    // client-go: a command containing a path separator is relative to the kubeconfig's
    // directory; a bare name is looked up in PATH.
    let command = if command.contains('/') {
        resolve(file, command).into_os_string()
    } else {
        command.into()
    };
    Ok(ExecConfig {
        origin,
        command,
        args: exec.args.clone().unwrap_or_default(),
        env: exec
            .env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|v| (v.name, v.value.unwrap_or_default()))
            .collect(),
        api_version: exec.api_version.clone().unwrap_or_default(),
        install_hint: exec.install_hint.clone().filter(|h| !h.is_empty()),
        interactive_mode: exec.interactive_mode.clone().filter(|m| !m.is_empty()),
        cluster: exec
            .provide_cluster_info
            .unwrap_or(false)
            .then(|| cluster.to_json()),
    })
}

/// PEM from `FIELD-data` (base64, wins like in client-go) or from the file `FIELD` names.
/// Returns the bytes and where they came from, for error messages.
pub(super) fn pem_from_data_or_file(
    origin: &str,
    file: &Path,
    field: &str,
    data: Option<&str>,
    path: Option<&str>,
) -> Result<Option<(Vec<u8>, String)>, ConfigError> {
    if let Some(data) = data.filter(|d| !d.trim().is_empty()) {
        let origin = format!("{origin}, {field}-data");
        let pem = base64_decode(data).map_err(|problem| ConfigError::Invalid {
            origin: origin.clone(),
            problem,
        })?;
        return Ok(Some((pem, origin)));
    }
    if let Some(path) = path.filter(|p| !p.is_empty()) {
        let path = resolve(file, path);
        let what = format!("{origin}, {field}");
        let pem = read_file(&path, &what)?;
        return Ok(Some((pem, format!("{what} {}", path.display()))));
    }
    Ok(None)
}

pub(super) fn read_file(path: &Path, what: &str) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|error| ConfigError::Read {
        what: what.to_string(),
        path: path.to_path_buf(),
        error,
    })
}

/// A path from a kubeconfig: relative ones are relative to the directory of the file that
/// contains them (client-go's `ResolvePaths`).
pub(super) fn resolve(kubeconfig: &Path, path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        return path.to_path_buf();
    }
    // Dropping "." components keeps "./bin/plugin" readable in messages.
    let relative: PathBuf = path
        .components()
        .filter(|c| *c != std::path::Component::CurDir)
        .collect();
    kubeconfig.parent().unwrap_or(Path::new("")).join(relative)
}

/// `https://host:port[/prefix]` without a trailing slash. A bare `host:port` means https, as in
/// client-go's `DefaultServerURL`.
pub(super) fn normalize_server(server: &str) -> Result<String, String> {
    let server = server.trim();
    let url = if server.contains("://") {
        server.to_string()
    } else {
        format!("https://{server}")
    };
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(format!(
            "server {server:?} is not an http:// or https:// URL"
        ));
    }
    // Parsed now, by the parser every request's URL goes through, so that a typo is a
    // configuration error at start rather than a request error retried as unreachable.
    let parsed = ureq::AgentBuilder::new()
        .build()
        .request("GET", &url)
        .request_url();
    if let Err(e) = parsed {
        let why = std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string());
        return Err(format!("server {server:?} is not a valid URL: {why}"));
    }
    Ok(url.trim_end_matches('/').to_string())
}

pub(super) fn available<T>(entries: &BTreeMap<String, T>) -> String {
    if entries.is_empty() {
        return "none".to_string();
    }
    entries
        .keys()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}
