//! The API layer: routes a request to discovery or to a resource verb, applies injected
//! faults, authentication and authorization, and performs the verb on the store.

use crate::accept::{self, Format};
use crate::admission;
use crate::auth::Attributes;
use crate::discovery;
use crate::faults::{self, Logged};
use crate::http::Request;
use crate::openapi;
use crate::patch::{self, PatchError};
use crate::podspec;
use crate::policy_admission::{self, Attempt};
use crate::reply::{Reply, Start, WatchPlan};
use crate::resources::{self, Class, ResourceDef};
use crate::review;
use crate::route::{parse_route, Route, Target};
use crate::selector::Selector;
use crate::shared::Shared;
use crate::status::{ApiError, Cause, Details};
use crate::store::{
    not_served, DeleteOpts, EventType, NamespaceState, Obj, Propagation, Store, WatchStart,
};
use crate::strategy;
use crate::table;
use crate::token;
use crate::util;
use crate::validate;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn ok_value(code: u16, v: &Value) -> Reply {
    Reply::Json {
        code,
        body: serde_json::to_vec(v).unwrap_or_default(),
        headers: Vec::new(),
    }
}

fn ok_bytes(code: u16, body: Vec<u8>) -> Reply {
    Reply::Json {
        code,
        body,
        headers: Vec::new(),
    }
}

fn error(e: ApiError) -> Reply {
    let headers = e
        .retry_after()
        .map(|s| vec![("Retry-After", s.to_string())])
        .unwrap_or_default();
    log::debug!(code = e.code(); "request failed");
    Reply::Json {
        code: e.code(),
        body: e.to_json(),
        headers,
    }
}

fn is_true(v: Option<&str>) -> bool {
    matches!(v, Some("true" | "1" | "True"))
}

/// The authorization verb of a request.
fn verb_of(req: &Request, route: &Route) -> &'static str {
    let Route::Resource(t) = route else {
        return match req.method.as_str() {
            "GET" | "HEAD" => "get",
            "POST" => "post",
            "PUT" => "put",
            "PATCH" => "patch",
            "DELETE" => "delete",
            _ => "unknown",
        };
    };
    match (req.method.as_str(), t.name.is_some()) {
        ("GET", _) if is_true(req.param("watch")) => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

/// The path with its query, as fault rules and the request log match and show it.
fn target_text(req: &Request) -> String {
    if req.query.is_empty() {
        return req.path.clone();
    }
    let q: Vec<String> = req.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{}?{}", req.path, q.join("&"))
}

/// Holds a write that is ready to commit while a `before_commit` stall rule says so. Called
/// with no store lock held, so reads and other writes go on meanwhile.
fn hold_before_commit(shared: &Shared, req: &Request, verb: &str, user: &str) {
    faults::wait_out_stalls(
        &shared.faults,
        &shared.stall_lifted,
        verb,
        &target_text(req),
        user,
        true,
    );
}

/// Handles one request, holding it first while a stall rule says so, and logs it when the
/// request log is on.
pub fn handle(shared: &Shared, req: &Request) -> Reply {
    let received = Instant::now();
    let route = parse_route(&req.path);
    let verb = verb_of(req, &route);
    let label = match &route {
        Route::Resource(t) => t.label(),
        _ => req.path.clone(),
    };
    *shared
        .counts()
        .entry((verb.to_string(), label.clone()))
        .or_insert(0) += 1;

    let target_text = target_text(req);
    let user = {
        let users = shared.users.read().unwrap_or_else(|e| e.into_inner());
        users
            .authenticate(req.header("authorization"))
            .map(|u| u.name.clone())
            .unwrap_or_default()
    };
    faults::wait_out_stalls(
        &shared.faults,
        &shared.stall_lifted,
        verb,
        &target_text,
        &user,
        false,
    );
    let flying = shared.costs.enter();
    spend_modeled_costs(shared, &route, verb);
    let reply = handle_route(shared, req, route, verb, &target_text);
    drop(flying);
    if let Some(log) = shared.log().as_mut() {
        log.push(Logged {
            received,
            answered: Instant::now(),
            user,
            verb: verb.to_string(),
            resource: label,
            target: target_text,
            code: match &reply {
                Reply::Json { code, .. } => *code,
                Reply::Watch(..) => 200,
            },
        });
    }
    reply
}

/// What the request costs the modeled control plane (nothing unless a [`crate::CostModel`] is set):
/// its CPU, queued for a modeled core, and for a write the commit batch it joins. Spent
/// before the request takes effect, as a real server's writes become visible once committed.
fn spend_modeled_costs(shared: &Shared, route: &Route, verb: &str) {
    let model = shared.costs.model();
    if !model.is_on() {
        return;
    }
    let write = matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    );
    if !write {
        shared.costs.spend(model.read);
        return;
    }
    let mut cpu = model.write;
    if let Route::Resource(t) = route {
        let store = shared.read();
        if let Ok(def) = lookup(&store, t, verb) {
            let mut watchers = store.watchers_of(&def.key(), t.namespace.as_deref());
            if def.class == Class::Pod {
                watchers += model.pod_watchers;
            }
            cpu += model.per_watcher * watchers as u32;
        }
    }
    shared.costs.spend(cpu);
    shared.costs.commit();
}

fn handle_route(
    shared: &Shared,
    req: &Request,
    route: Route,
    verb: &'static str,
    target_text: &str,
) -> Reply {
    if let Some(e) = shared.faults().take(verb, target_text) {
        return error(e);
    }

    let authorized = {
        // Cloned out, so that no store lock is taken under the users' lock.
        let user = shared
            .users
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .authenticate(req.header("authorization"))
            .cloned();
        match user {
            Some(user) if user.valid(util::unix_now(), || shared.read()) => match &route {
                Route::Resource(t) => {
                    let attrs = Attributes {
                        verb,
                        group: &t.group,
                        resource: &t.resource,
                        subresource: t.sub.as_deref(),
                        namespace: t.namespace.as_deref(),
                        name: t.name.as_deref(),
                    };
                    if user.allows(&attrs.ask(), || shared.read()) {
                        Ok(user.name)
                    } else {
                        Err(attrs.forbidden(&user.name))
                    }
                }
                _ => Ok(user.name),
            },
            _ => Err(ApiError::Unauthorized),
        }
    };
    let user = match authorized {
        Ok(u) => u,
        Err(e) => return error(e),
    };

    let result = match route {
        Route::Version => Ok(ok_value(200, &discovery::version())),
        Route::Health => Ok(ok_bytes(200, b"ok".to_vec())),
        Route::CoreVersions => Ok(ok_value(200, &discovery::core_versions(shared.port))),
        Route::GroupList => Ok(ok_value(200, &discovery::group_list(&shared.read().defs()))),
        Route::Group(g) => discovery::group(&g, &shared.read().defs())
            .map(|v| ok_value(200, &v))
            .ok_or_else(not_served),
        Route::ResourceList(g, v) => discovery::resource_list(&g, &v, &shared.read().defs())
            .map(|v| ok_value(200, &v))
            .ok_or_else(not_served),
        Route::OpenApiRoot => Ok(ok_value(
            200,
            &discovery::openapi_root(&shared.read().defs()),
        )),
        Route::OpenApi(g, v) => discovery::openapi_group_version(&g, &v, &shared.read().defs())
            .map(|v| ok_value(200, &v))
            .ok_or_else(not_served),
        Route::Unknown => Err(not_served()),
        Route::Resource(t) if review::serves(&t) => review::handle(shared, req, &t, verb),
        Route::Resource(t) if token::serves(&t) => token::request(shared, req, &t, verb),
        Route::Resource(t) => match verb {
            "create" if t.sub.as_deref() == Some("eviction") => evict(shared, req, &t),
            "get" => get(shared, req, &t),
            "list" => list(shared, req, &t),
            "watch" => watch(shared, req, &t),
            "create" => create(shared, req, &t, &user),
            "update" => update(shared, req, &t, &user),
            "patch" => patch(shared, req, &t, &user),
            "delete" => delete(shared, req, &t, &user),
            "deletecollection" => delete_collection(shared, req, &t, &user),
            _ => Err(ApiError::MethodNotAllowed(
                "the server does not allow this method on the requested resource".into(),
            )),
        },
    };
    result.unwrap_or_else(error)
}

/// Creates `obj` at the collection `path` as the admin would, without counting the request
/// or applying faults (used to pre-install the CRD).
pub fn create_direct(shared: &Shared, path: &str, obj: Value) -> Result<(), ApiError> {
    let Route::Resource(t) = parse_route(path) else {
        return Err(not_served());
    };
    let req = Request {
        method: "POST".into(),
        path: path.into(),
        body: serde_json::to_vec(&obj).unwrap_or_default(),
        ..Request::default()
    };
    create(shared, &req, &t, "admin").map(|_| ())
}

/// GET of `path` (an object or a collection, with an optional query) without HTTP, auth,
/// faults or counters; `None` unless it would answer 200.
pub fn get_direct(shared: &Shared, path: &str) -> Option<Value> {
    let (p, q) = path.split_once('?').unwrap_or((path, ""));
    let req = Request {
        method: "GET".into(),
        path: p.into(),
        query: util::parse_query(q),
        ..Request::default()
    };
    let Route::Resource(t) = parse_route(p) else {
        return None;
    };
    let reply = if t.name.is_some() {
        get(shared, &req, &t)
    } else {
        list(shared, &req, &t)
    };
    match reply {
        Ok(Reply::Json {
            code: 200, body, ..
        }) => serde_json::from_slice(&body).ok(),
        _ => None,
    }
}

/// The resource a target names, checked for scope and subresource.
fn lookup(store: &Store, t: &Target, verb: &str) -> Result<Arc<ResourceDef>, ApiError> {
    let def = store
        .resolve(&t.group, &t.version, &t.resource)
        .ok_or_else(not_served)?;
    let collection_read = matches!(verb, "list" | "watch");
    if def.namespaced && t.namespace.is_none() && verb == "deletecollection" {
        return Err(not_served());
    }
    if def.namespaced && t.namespace.is_none() && !collection_read {
        return Err(not_served());
    }
    if !def.namespaced && t.namespace.is_some() {
        return Err(not_served());
    }
    match t.sub.as_deref() {
        None => {}
        Some("status") if def.status_subresource && matches!(verb, "get" | "update" | "patch") => {}
        Some("eviction") if def.class == Class::Pod && verb == "create" => {}
        Some(_) if verb == "deletecollection" => return Err(not_served()),
        Some(_) => return Err(not_served()),
    }
    Ok(def)
}

/// Parses a JSON (or YAML) request body into an object.
fn parse_body(req: &Request) -> Result<Value, ApiError> {
    let yaml = req
        .header("content-type")
        .is_some_and(|c| c.contains("yaml"));
    let v: Value = if yaml {
        serde_yaml::from_slice(&req.body).map_err(|e| ApiError::BadRequest(format!("yaml: {e}")))?
    } else {
        serde_json::from_slice(&req.body).map_err(|e| {
            ApiError::BadRequest(format!("couldn't get version/kind; json parse error: {e}"))
        })?
    };
    Ok(v)
}

fn as_object(v: Value) -> Result<Map<String, Value>, ApiError> {
    match v {
        Value::Object(m) => Ok(m),
        _ => Err(ApiError::BadRequest(
            "the body of the request must be a JSON object".into(),
        )),
    }
}

fn meta_mut(obj: &mut Map<String, Value>) -> &mut Map<String, Value> {
    util::obj_mut(obj, "metadata")
}

fn meta_str<'a>(v: &'a Value, field: &str) -> &'a str {
    v["metadata"][field].as_str().unwrap_or("")
}

fn encode(def: &ResourceDef, version: &str, obj: &Value) -> Vec<u8> {
    resources::encode_object(def, version, obj)
}

fn get(shared: &Shared, req: &Request, t: &Target) -> Result<Reply, ApiError> {
    let name = t.name.as_deref().unwrap_or("");
    // Read under the shared lock, encoded after it (reads never wait for each other's
    // encoding, nor a write for it).
    let (def, obj, rv) = {
        let store = shared.read();
        let def = lookup(&store, t, "get")?;
        let obj = store
            .get(&def.key(), t.namespace.as_deref().unwrap_or(""), name)
            .ok_or_else(|| def.not_found(name))?;
        (def, obj, store.rv())
    };
    match accept::negotiate(req.header("accept")) {
        Format::Table => Ok(ok_value(
            200,
            &table::render(
                &def,
                &t.version,
                &[obj],
                rv,
                None,
                req.param("includeObject"),
            ),
        )),
        Format::Metadata {
            list: false,
            version,
        } => Ok(ok_value(200, &accept::partial(version, &obj))),
        Format::Metadata { list: true, .. } => Err(accept::mismatch(&def, true)),
        Format::Object => Ok(ok_bytes(200, encode(&def, &t.version, &obj))),
    }
}

fn selectors(
    req: &Request,
    def: &ResourceDef,
    name: Option<&str>,
) -> Result<(Selector, Selector), ApiError> {
    let labels = Selector::parse_labels(req.param("labelSelector").unwrap_or(""))
        .map_err(ApiError::BadRequest)?;
    let mut field_text = req.param("fieldSelector").unwrap_or("").to_string();
    if let Some(n) = name {
        // A watch on one object is a watch with a name field selector.
        if !field_text.is_empty() {
            field_text.push(',');
        }
        field_text.push_str(&format!("metadata.name={n}"));
    }
    let fields = Selector::parse_fields(&field_text, def.class).map_err(ApiError::BadRequest)?;
    Ok((labels, fields))
}

/// `continue` tokens: hex of `rv\0namespace\0name` of the last item sent.
fn encode_continue(rv: u64, key: &(String, String)) -> String {
    util::hex(format!("{rv}\0{}\0{}", key.0, key.1).as_bytes())
}

fn decode_continue(token: &str) -> Option<(u64, (String, String))> {
    let text = String::from_utf8(util::unhex(token)?).ok()?;
    let mut parts = text.split('\0');
    let rv = parts.next()?.parse().ok()?;
    let ns = parts.next()?.to_string();
    let name = parts.next()?.to_string();
    Some((rv, (ns, name)))
}

const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

fn list(shared: &Shared, req: &Request, t: &Target) -> Result<Reply, ApiError> {
    let limit: usize = req.param("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
    let token = req.param("continue").filter(|c| !c.is_empty());
    // Selected under the shared lock (the items are `Arc`s), encoded after it.
    let (def, items, next, rv) = {
        let store = shared.read();
        let def = lookup(&store, t, "list")?;
        let (labels, fields) = selectors(req, &def, None)?;
        let (list_rv, after) = match token {
            None => (store.rv(), None),
            Some(tok) => {
                let (rv, after) = decode_continue(tok).ok_or_else(|| {
                    ApiError::BadRequest("continue key is not valid: invalid continue token".into())
                })?;
                if rv < store.compacted() {
                    return Err(ApiError::Expired(CONTINUE_EXPIRED.into()));
                }
                (rv, Some(after))
            }
        };
        let (items, next) = store.list(&def.key(), t.namespace.as_deref(), after, limit, |o| {
            labels.matches_labels(o) && fields.matches_fields(o)
        });
        (def, items, next, list_rv)
    };
    let cont = next.map(|k| encode_continue(rv, &k));
    match accept::negotiate(req.header("accept")) {
        Format::Table => Ok(ok_value(
            200,
            &table::render(
                &def,
                &t.version,
                &items,
                rv,
                cont.as_deref(),
                req.param("includeObject"),
            ),
        )),
        Format::Metadata {
            list: true,
            version,
        } => Ok(ok_value(
            200,
            &accept::partial_list(version, &items, rv, cont.as_deref()),
        )),
        Format::Metadata { list: false, .. } => Err(accept::mismatch(&def, false)),
        Format::Object => Ok(ok_bytes(
            200,
            encode_list(&def, &t.version, &items, rv, cont.as_deref()),
        )),
    }
}

/// A `<Kind>List` of `items`. Built by hand so the items (already JSON values) are written
/// once, without copying them into a list value first.
fn encode_list(
    def: &ResourceDef,
    version: &str,
    items: &[Obj],
    rv: u64,
    cont: Option<&str>,
) -> Vec<u8> {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    match cont {
        Some(c) => meta["continue"] = json!(c),
        // Unstructured lists (custom resources) always carry `continue` (fixture 10).
        None if def.is_custom() => meta["continue"] = json!(""),
        None => {}
    }
    let mut out = Vec::with_capacity(256 + items.len() * 1024);
    out.extend_from_slice(b"{\"kind\":");
    out.extend(serde_json::to_vec(&def.list_kind).unwrap_or_default());
    out.extend_from_slice(b",\"apiVersion\":");
    out.extend(serde_json::to_vec(&def.api_version(version)).unwrap_or_default());
    out.extend_from_slice(b",\"metadata\":");
    out.extend(serde_json::to_vec(&meta).unwrap_or_default());
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if def.is_custom() {
            resources::write_object(&mut out, def, version, item);
        } else {
            let _ = serde_json::to_writer(&mut out, &**item);
        }
    }
    out.extend_from_slice(b"]}");
    out
}

/// Default watch length when the client gives no `timeoutSeconds`: kube-apiserver's
/// `--min-request-timeout` (it randomizes up to twice that).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

fn watch(shared: &Shared, req: &Request, t: &Target) -> Result<Reply, ApiError> {
    let from = match req.param("resourceVersion") {
        None | Some("") | Some("0") => None,
        Some(s) => Some(s.parse::<u64>().map_err(|_| {
            ApiError::BadRequest(format!("resourceVersion: Invalid value: {s:?}: strconv.ParseUint: parsing {s:?}: invalid syntax"))
        })?),
    };
    // 0 or absent means the server's default, as in kube-apiserver.
    let timeout = req
        .param("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);
    let bookmarks = is_true(req.param("allowWatchBookmarks"));
    let format = accept::negotiate(req.header("accept"));
    // Read before the stream is registered: a freeze that a test starts once it sees the watch
    // open must hold this stream (taken later, a freeze in between would miss it).
    let epoch = shared.faults().watch_epoch();
    // Registering changes the resource's watchers: under the write lock, so that the backlog
    // replayed and the events sent afterwards meet with no gap and no overlap.
    let mut store = shared.write();
    let def = lookup(&store, t, "watch")?;
    if let Format::Metadata { list: true, .. } = format {
        // Each event carries one object: a metadata list cannot be its form.
        return Err(accept::mismatch(&def, true));
    }
    let (labels, fields) = selectors(req, &def, t.name.as_deref())?;
    let key = def.key();
    let start = match store.watch(&key, t.namespace.as_deref(), from) {
        WatchStart::Started { id, rx, backlog } => Start::Started { id, rx, backlog },
        WatchStart::Expired { requested, oldest } => Start::Expired(ApiError::Expired(format!(
            "too old resource version: {requested} ({oldest})"
        ))),
    };
    let from = from.unwrap_or_else(|| store.rv());
    drop(store);
    let table = (format == Format::Table).then(|| req.param("includeObject").map(String::from));
    let metadata = match format {
        Format::Metadata { version, .. } => Some(version),
        _ => None,
    };
    let plan = WatchPlan {
        def,
        version: t.version.clone(),
        start,
        labels,
        fields,
        timeout,
        bookmarks,
        from,
        table,
        metadata,
        epoch,
    };
    Ok(Reply::Watch(Box::new(plan), key))
}

/// Checks `apiVersion`/`kind` in a body against the resource, then removes them (objects
/// are stored without them).
fn strip_type(
    def: &ResourceDef,
    version: &str,
    obj: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    let want = def.api_version(version);
    if let Some(av) = obj.remove("apiVersion").as_ref().and_then(Value::as_str) {
        if !av.is_empty() && av != want {
            return Err(ApiError::BadRequest(format!(
                "the API version in the data ({av}) does not match the expected API version ({want})"
            )));
        }
    }
    if let Some(k) = obj.remove("kind").as_ref().and_then(Value::as_str) {
        if !k.is_empty() && k != def.kind {
            return Err(ApiError::BadRequest(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                def.kind
            )));
        }
    }
    Ok(())
}

/// Puts the request's namespace into the object, refusing a different one in the body.
fn set_namespace(
    def: &ResourceDef,
    t: &Target,
    obj: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    let meta = meta_mut(obj);
    if !def.namespaced {
        meta.remove("namespace");
        return Ok(());
    }
    let ns = t.namespace.clone().unwrap_or_default();
    if let Some(body_ns) = meta.get("namespace").and_then(Value::as_str) {
        if !body_ns.is_empty() && body_ns != ns {
            return Err(ApiError::BadRequest(
                "the namespace of the provided object does not match the namespace sent on the request".into(),
            ));
        }
    }
    meta.insert("namespace".into(), json!(ns));
    Ok(())
}

/// Validation common to creates and updates, plus the resource's own rules.
fn validation_causes(def: &ResourceDef, version: &str, obj: &Value) -> Vec<Cause> {
    let mut causes = validate::validate_metadata(def, &obj["metadata"]);
    causes.extend(validate::validate_object(def, obj, version));
    if def.class == Class::Crd {
        if let Err(c) = resources::from_crd(obj) {
            causes.extend(c);
        }
    }
    causes
}

/// What the API server's decoder does with a body before anything else: a pod whose
/// quantities do not parse cannot be decoded (400); fields its type does not know (a pod's Go
/// type, a custom resource's structural schema) are dropped, each with a warning
/// (`fieldValidation` Warn, the default since 1.27), silently (Ignore), or refuse the request
/// (Strict, which kubectl sends); an init container's `restartPolicy` is dropped unless
/// `sidecars` (the SidecarContainers gate). Returns the warnings.
fn prune(
    sidecars: bool,
    req: &Request,
    def: &ResourceDef,
    version: &str,
    obj: &mut Value,
) -> Result<Vec<String>, ApiError> {
    // `transformDecodeError`: what the decoder says, prefixed with what it was decoding.
    let decode_error = |why: &str| {
        ApiError::BadRequest(format!(
            "{kind} in version {version:?} cannot be handled as a {kind}: {why}",
            kind = def.kind
        ))
    };
    let removed = if def.class == Class::Pod {
        if let Some(why) = podspec::quantity_error(&obj["spec"]) {
            return Err(decode_error(why));
        }
        // Without the SidecarContainers gate (1.28's default) an init container's
        // `restartPolicy` is dropped, with no warning (`dropDisabledFields`): such a container
        // runs as any init container, to completion.
        if !sidecars {
            if let Some(Value::Array(init)) = obj["spec"].get_mut("initContainers") {
                for c in init.iter_mut().filter_map(Value::as_object_mut) {
                    c.remove("restartPolicy");
                }
            }
        }
        openapi::prune_pod(obj)
    } else if let Some(schema) = def.schema(version).filter(|_| def.is_custom()) {
        let mut removed = Vec::new();
        validate::prune(schema, obj, "", &mut removed);
        removed
    } else {
        return Ok(Vec::new());
    };
    let unknown: Vec<String> = removed
        .iter()
        .map(|f| format!("unknown field {f:?}"))
        .collect();
    match req.param("fieldValidation") {
        Some("Strict") if !unknown.is_empty() => Err(decode_error(&format!(
            "strict decoding error: {}",
            unknown.join(", ")
        ))),
        Some("Ignore") => Ok(Vec::new()),
        _ => Ok(unknown),
    }
}

/// 404 or 403 unless namespace `ns` exists and is not terminating (the NamespaceLifecycle
/// admission plugin), for a create of `name`.
fn check_namespace(
    store: &Store,
    def: &ResourceDef,
    ns: Option<&str>,
    name: &str,
) -> Result<(), ApiError> {
    let Some(ns) = ns.filter(|_| def.namespaced) else {
        return Ok(());
    };
    match store.namespace_state(ns) {
        NamespaceState::Active => Ok(()),
        NamespaceState::Missing => Err(ApiError::NotFound(
            format!("namespaces {ns:?} not found"),
            Details {
                name: ns.to_string(),
                kind: "namespaces".into(),
                ..Details::default()
            },
        )),
        NamespaceState::Terminating => Err(ApiError::Forbidden(
            format!(
                "{} {name:?} is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                def.key()
            ),
            def.details(name),
        )),
    }
}

/// POST of a new object, in three steps as kube-apiserver's create handler and etcd take
/// them: what needs only the request (decoding, defaulting, validation) runs unlocked; what
/// reads other objects without having to be atomic with the write (the namespace's
/// labels for PodSecurity, the policies) under the shared lock; and under the write lock,
/// briefly, what must be decided together with the commit: the namespace still accepting
/// objects, the quota (so that two creates cannot both take its last pod), the name being
/// free (AlreadyExists), then the commit itself.
fn create(shared: &Shared, req: &Request, t: &Target, user: &str) -> Result<Reply, ApiError> {
    let mut obj = as_object(parse_body(req)?)?;
    let def = lookup(&shared.read(), t, "create")?;
    if t.name.is_some() {
        return Err(ApiError::MethodNotAllowed(
            "the server does not allow this method on the requested resource".into(),
        ));
    }
    strip_type(&def, &t.version, &mut obj)?;
    set_namespace(&def, t, &mut obj)?;
    let now = util::now_rfc3339();
    let meta = meta_mut(&mut obj);
    if meta
        .get("resourceVersion")
        .and_then(Value::as_str)
        .is_some_and(|rv| !rv.is_empty())
    {
        return Err(ApiError::Internal(
            "resourceVersion should not be set on objects to be created".into(),
        ));
    }
    let mut name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if name.is_empty() {
        if let Some(prefix) = meta
            .get("generateName")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
        {
            name = format!("{prefix}{}", util::name_suffix());
            meta.insert("name".into(), json!(name));
        }
    }
    meta.insert("uid".into(), json!(util::new_uid()));
    meta.insert("creationTimestamp".into(), json!(now));
    for server_owned in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
        "managedFields",
        "generation",
    ] {
        meta.remove(server_owned);
    }
    strategy::apply_defaults(&def, &mut obj);
    strategy::prepare_create(&def, &mut obj, &now);
    strategy::omit_empty_metadata(&mut obj);
    let mut obj = Value::Object(obj);
    let decode_warnings = prune(shared.sidecar_containers, req, &def, &t.version, &mut obj)?;
    // What the decoder warned of goes with a refusal too: a pod whose sleep action it did not
    // know is refused for the handler left missing, with the warning saying why (fixture 51).
    let refused_with = decode_warnings.clone();
    let decided = (move || -> Result<Reply, ApiError> {
        if def.class == Class::Pod {
            // Mutating admission: after defaulting, before validation and validating admission.
            let mutations = shared
                .pod_mutations
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            for m in &mutations {
                patch::strategic_merge(&mut obj, m);
            }
            // What a webhook added is defaulted too (a patched object is decoded again), and the
            // QoS class is the mutated pod's (the strategy's PrepareForCreate runs after admission).
            if let (false, Some(map)) = (mutations.is_empty(), obj.as_object_mut()) {
                strategy::apply_defaults(&def, map);
                strategy::prepare_create(&def, map, &now);
            }
        }

        // Admission (namespace lifecycle) comes before validation, as on a real server; it is
        // checked again when committing, where it counts.
        check_namespace(&shared.read(), &def, t.namespace.as_deref(), &name)?;
        let causes = validation_causes(&def, &t.version, &obj);
        if !causes.is_empty() {
            return Err(def.invalid(&name, causes));
        }
        // Validating admission runs after validation and before storage (so before
        // AlreadyExists), as in kube-apiserver, its plugins in the order of the default list:
        // PodSecurity, ValidatingAdmissionPolicy, ResourceQuota. The first two read the store as
        // kube-apiserver's read their informers' caches, not atomically with the write.
        let ns = t.namespace.as_deref().unwrap_or("");
        let warnings = {
            let store = shared.read();
            if def.class == Class::Pod {
                admission::pod_security(&store, ns, &name, &obj)?;
            }
            let mut warnings = decode_warnings;
            warnings.extend(policy_admission::admit(
                &store,
                &Attempt {
                    operation: "CREATE",
                    def: &def,
                    version: &t.version,
                    subresource: None,
                    namespace: ns,
                    name: &name,
                    object: Some(&obj),
                    old: None,
                    user,
                },
            )?);
            warnings
        };
        let key = def.key();
        hold_before_commit(shared, req, "create", user);
        let stored = {
            let mut store = shared.write();
            if !store.serves(&key) {
                // Its CRD was deleted meanwhile.
                return Err(not_served());
            }
            check_namespace(&store, &def, t.namespace.as_deref(), &name)?;
            let quotas = if def.class == Class::Pod {
                admission::quota(&store, ns, &name)?
            } else {
                Vec::new()
            };
            if store.get(&key, ns, &name).is_some() {
                return Err(def.already_exists(&name));
            }
            if def.class == Class::ResourceQuota {
                obj = admission::with_usage(&store, &obj);
            }
            let stored = store.commit(&key, EventType::Added, obj, None);
            for q in quotas {
                // Admission charges the admitted pod to each quota's `status.used`.
                let next = admission::with_usage(&store, &q);
                if next != *q {
                    store.update("resourcequotas", next, q);
                }
            }
            if def.class == Class::Crd {
                if let Ok(custom) = resources::from_crd(&stored) {
                    store.serve(custom);
                }
            }
            stored
        };
        Ok(with_warnings(
            ok_bytes(201, encode(&def, &t.version, &stored)),
            warnings,
        ))
    })();
    match decided {
        Err(e) if !refused_with.is_empty() => Ok(with_warnings(error(e), refused_with)),
        other => other,
    }
}

/// `Warning: 299 - "text"` headers (`net.NewWarningHeader`), as admission warnings reach
/// clients (kubectl prints them).
fn with_warnings(mut reply: Reply, warnings: Vec<String>) -> Reply {
    if let Reply::Json { headers, .. } = &mut reply {
        for w in warnings {
            let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
            headers.push(("Warning", format!("299 - \"{escaped}\"")));
        }
    }
    reply
}

/// How many times an update is computed optimistically, from the object as read and with no
/// lock held, and committed only if that object is still the stored one, before a last attempt
/// holds the write lock from the read to the commit. kube-apiserver's GuaranteedUpdate retries
/// without a bound (etcd has no lock to fall back on); the bound here keeps a writer racing a
/// busy object (a pod the kubelet keeps writing) from retrying for ever.
const OPTIMISTIC_ATTEMPTS: usize = 3;

/// The resource a write addresses and its object as stored now (404 when there is none).
fn current(store: &Store, t: &Target, verb: &str) -> Result<(Arc<ResourceDef>, Obj), ApiError> {
    let def = lookup(store, t, verb)?;
    let name = t.name.as_deref().unwrap_or("");
    let cur = store
        .get(&def.key(), t.namespace.as_deref().unwrap_or(""), name)
        .ok_or_else(|| def.not_found(name))?;
    Ok((def, cur))
}

/// PUT and PATCH, as kube-apiserver's `GuaranteedUpdate` does them: read the object, compute
/// the whole intended object from it with `next` (decoding was done before; patching,
/// defaulting, validation and the resourceVersion precondition happen here, with no lock
/// held, so writes to different objects compute in parallel), run validating admission
/// under the shared lock, then take the write lock and commit only if the object read is
/// still the stored one; otherwise start again from the object as it is now. So whatever is
/// decided (a 409 of a precondition included) is decided against the object as it is at
/// commit time, and of two writers racing with the same resourceVersion exactly one wins.
/// A write that changes nothing keeps the resourceVersion (nothing is committed). Returns
/// the resource, the stored object and the admission warnings.
fn guaranteed_update(
    shared: &Shared,
    req: &Request,
    t: &Target,
    verb: &str,
    user: &str,
    next: impl Fn(&ResourceDef, &Obj) -> Result<Value, ApiError>,
) -> Result<(Arc<ResourceDef>, Obj, Vec<String>), ApiError> {
    let name = t.name.as_deref().unwrap_or("");
    let ns = t.namespace.as_deref().unwrap_or("");
    for attempt in 0..=OPTIMISTIC_ATTEMPTS {
        let held = (attempt == OPTIMISTIC_ATTEMPTS).then(|| shared.write());
        let (def, cur) = match &held {
            Some(store) => current(store, t, verb)?,
            None => current(&shared.read(), t, verb)?,
        };
        let decided = next(&def, &cur).and_then(|new| {
            let warnings = match &held {
                Some(store) => admit_update(store, &def, t, &cur, &new, user),
                None => admit_update(&shared.read(), &def, t, &cur, &new, user),
            }?;
            // Compared outside the lock; equal means there is nothing to store.
            let changed = new != *cur;
            Ok((changed.then_some(new), warnings))
        });
        let mut store = match held {
            Some(store) => store,
            None => {
                if attempt == 0 {
                    hold_before_commit(shared, req, verb, user);
                }
                shared.write()
            }
        };
        let key = def.key();
        if !store
            .get(&key, ns, name)
            .is_some_and(|now| Arc::ptr_eq(&now, &cur))
        {
            // Written (or deleted) since it was read: decide again on what is there now.
            continue;
        }
        let (new, warnings) = decided?;
        let Some(new) = new else {
            return Ok((def, cur, warnings));
        };
        let stored = store.update(&key, new, cur);
        if def.class == Class::Crd {
            if let Ok(custom) = resources::from_crd(&stored) {
                store.serve(custom);
            }
        }
        return Ok((def, stored, warnings));
    }
    // The last attempt held the write lock throughout: the object cannot have moved.
    Err(ApiError::Internal(format!(
        "{} {name:?} kept changing while it was being updated",
        t.resource
    )))
}

/// Validating admission of an update of `cur` to `new`. It sees no-op writes too: the
/// storage layer finds them unchanged only after.
fn admit_update(
    store: &Store,
    def: &ResourceDef,
    t: &Target,
    cur: &Value,
    new: &Value,
    user: &str,
) -> Result<Vec<String>, ApiError> {
    policy_admission::admit(
        store,
        &Attempt {
            operation: "UPDATE",
            def,
            version: &t.version,
            subresource: t.sub.as_deref(),
            namespace: t.namespace.as_deref().unwrap_or(""),
            name: t.name.as_deref().unwrap_or(""),
            object: Some(new),
            old: Some(cur),
            user,
        },
    )
}

/// The shared end of PUT and PATCH, computed from `cur` alone (no lock held): `new` is the
/// whole intended object, sent whole by a PUT (`put`) or patched. Checks name, namespace,
/// the resourceVersion precondition and the uid, keeps server-owned fields, applies the
/// status-subresource rules and validates. Returns the object to store.
fn prepare_update(
    req: &Request,
    def: &ResourceDef,
    t: &Target,
    cur: &Obj,
    mut new: Map<String, Value>,
    put: bool,
) -> Result<Value, ApiError> {
    let name = t.name.as_deref().unwrap_or("");
    {
        let meta = meta_mut(&mut new);
        match meta.get("name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() && n != name => {
                return Err(ApiError::BadRequest(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )))
            }
            _ => {
                meta.insert("name".into(), json!(name));
            }
        }
    }
    set_namespace(def, t, &mut new)?;
    let cur_rv = meta_str(cur, "resourceVersion").to_string();
    let meta = meta_mut(&mut new);
    match meta
        .get("resourceVersion")
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
    {
        Some(rv) if rv != cur_rv => return Err(def.conflict_modified(name)),
        Some(_) => {}
        None if put && !def.unconditional_update() => {
            return Err(def.invalid(
                name,
                vec![Cause::invalid(
                    "metadata.resourceVersion",
                    "0x0",
                    "must be specified for an update",
                )],
            ))
        }
        None => {}
    }
    // A uid in a PUT's object is a precondition (`defaultUpdatedObjectInfo.Preconditions`):
    // 409. A patch has none: its uid is a change of an immutable field, found by validation
    // (fixture kube-1.28-kubelet/18), a pod's status patches included. A custom resource's
    // `/status` copies the stored object over the written one but its status (the CRD status
    // strategy's PrepareForUpdate), so a uid there is ignored and the write applied
    // (fixture 21). An empty uid keeps the stored one.
    let status_write = t.sub.as_deref() == Some("status");
    let mut uid_changed = None;
    if let Some(uid) = meta
        .get("uid")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
    {
        let cur_uid = meta_str(cur, "uid");
        if uid != cur_uid && put {
            return Err(uid_precondition_failed(def, name, uid, cur_uid));
        }
        if uid != cur_uid && !(status_write && def.is_custom()) {
            uid_changed = Some(Cause::invalid(
                "metadata.uid",
                &format!("{uid:?}"),
                "field is immutable",
            ));
        }
    }
    for owned in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match cur["metadata"].get(owned) {
            Some(v) => {
                meta.insert(owned.into(), v.clone());
            }
            None => {
                meta.remove(owned);
            }
        }
    }
    meta.remove("selfLink");
    meta.remove("managedFields");
    meta.insert("resourceVersion".into(), json!(cur_rv));
    if status_write {
        strategy::prepare_status_update(cur, &mut new);
    } else {
        strategy::prepare_update(def, cur, &mut new);
    }
    strategy::apply_defaults(def, &mut new);
    strategy::omit_empty_metadata(&mut new);
    let mut new = Value::Object(new);
    // An update's unknown-field warnings are not sent (only its admission warnings are). A
    // pod's status write keeps the stored spec, so there is nothing of it to decode again.
    // Disabled fields are dropped on create only: an update keeps those the stored pod has
    // (`dropDisabledFields`), and a pod's spec may not change anyway.
    if !(status_write && def.class == Class::Pod) {
        prune(true, req, def, &t.version, &mut new)?;
    }
    // kube-apiserver checks the uid twice, with the fields every kind shares and again in the
    // kind's own update validation: the cause comes twice, the message says it once.
    let mut causes: Vec<Cause> = uid_changed
        .into_iter()
        .flat_map(|c| [c.clone(), c])
        .collect();
    causes.extend(validation_causes(def, &t.version, &new));
    if !status_write {
        causes.extend(validate::validate_update(def, cur, &new));
    }
    if !causes.is_empty() {
        return Err(def.invalid(name, causes));
    }
    Ok(new)
}

/// 409 for an update whose object names another uid than the stored one (the wording of the
/// storage layer's precondition check; no fixture records it).
fn uid_precondition_failed(def: &ResourceDef, name: &str, want: &str, have: &str) -> ApiError {
    ApiError::Conflict(
        format!(
            "Operation cannot be fulfilled on {} {name:?}: StorageError: invalid object, Code: 4, \
             AdditionalErrorMsg: Precondition failed: UID in precondition: {want}, UID in object meta: {have}",
            def.key()
        ),
        def.details(name),
    )
}

fn update(shared: &Shared, req: &Request, t: &Target, user: &str) -> Result<Reply, ApiError> {
    let mut body = as_object(parse_body(req)?)?;
    // Whether the body is of this resource's kind is known before the object is read.
    let def = lookup(&shared.read(), t, "update")?;
    strip_type(&def, &t.version, &mut body)?;
    let (def, stored, warnings) = guaranteed_update(shared, req, t, "update", user, |def, cur| {
        prepare_update(req, def, t, cur, body.clone(), true)
    })?;
    Ok(with_warnings(
        ok_bytes(200, encode(&def, &t.version, &stored)),
        warnings,
    ))
}

/// The patch types a resource accepts, for the 415 message (fixture 20).
fn unsupported_patch(def: &ResourceDef) -> ApiError {
    let mut types =
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
            .to_string();
    if !def.is_custom() {
        types.push_str(", application/strategic-merge-patch+json");
    }
    ApiError::UnsupportedMediaType(format!(
        "the body of the request was in an unknown format - accepted media types include: {types}"
    ))
}

fn patch(shared: &Shared, req: &Request, t: &Target, user: &str) -> Result<Reply, ApiError> {
    let content_type = req
        .header("content-type")
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    let def = lookup(&shared.read(), t, "patch")?;
    let strategic = content_type == "application/strategic-merge-patch+json";
    let apply = content_type == "application/apply-patch+yaml";
    let supported = matches!(
        content_type.as_str(),
        "application/merge-patch+json" | "application/json-patch+json"
    ) || (strategic && !def.is_custom())
        || apply;
    if !supported {
        return Err(unsupported_patch(&def));
    }
    if apply && req.param("fieldManager").is_none_or(str::is_empty) {
        return Err(ApiError::BadRequest(
            "fieldManager is required for apply requests".into(),
        ));
    }
    let body: Value = if apply {
        parse_body(req)?
    } else {
        serde_json::from_slice(&req.body)
            .map_err(|e| ApiError::BadRequest(format!("error decoding patch: {e}")))?
    };
    let json_patch = content_type == "application/json-patch+json";
    // The patch is applied to the object as it is when the result is committed (retried on
    // the newer object otherwise), as kube-apiserver's patcher applies it inside
    // GuaranteedUpdate.
    let updated = guaranteed_update(shared, req, t, "patch", user, |def, cur| {
        let mut doc = (**cur).clone();
        if json_patch {
            // JSON patch paths address the object as clients see it, with kind and apiVersion.
            doc["kind"] = json!(def.kind);
            doc["apiVersion"] = json!(def.api_version(&t.version));
            patch::json_patch(&mut doc, &body).map_err(|e| match e {
                PatchError::Malformed(m) => ApiError::BadRequest(m),
                // Answered as kube-apiserver's patcher does (`NewGenericServerResponse` with
                // 422): which op failed is not said (fixture kube-1.28-kubelet/20).
                PatchError::Failed(_) => ApiError::Invalid(
                    "the server rejected our request due to an error in our request".into(),
                    Details::default(),
                ),
            })?;
        } else if !body.is_object() {
            // Found applying it, so after a 404 for a missing object.
            return Err(ApiError::BadRequest(
                "a merge patch must be a JSON object".into(),
            ));
        } else if strategic || (apply && !def.is_custom()) {
            patch::strategic_merge(&mut doc, &body);
        } else {
            patch::merge_patch(&mut doc, &body);
        }
        let mut new = as_object(doc)?;
        strip_type(def, &t.version, &mut new)?;
        prepare_update(req, def, t, cur, new, false)
    });
    let (def, stored, warnings) = match updated {
        // Server-side apply creates what does not exist yet.
        Err(ApiError::NotFound(..)) if apply => return apply_create(shared, req, t, user, body),
        other => other?,
    };
    Ok(with_warnings(
        ok_bytes(200, encode(&def, &t.version, &stored)),
        warnings,
    ))
}

/// Server-side apply of an object that does not exist: created from the applied
/// configuration as a POST would create it (201). Field ownership is not tracked: no
/// `managedFields`, no conflicts; applying to an existing object merges the configuration in
/// as a strategic merge patch (a merge patch for custom resources) would.
fn apply_create(
    shared: &Shared,
    req: &Request,
    t: &Target,
    user: &str,
    mut body: Value,
) -> Result<Reply, ApiError> {
    let name = t.name.clone().unwrap_or_default();
    if body["metadata"]["name"].as_str().unwrap_or("").is_empty() && body.is_object() {
        body["metadata"]["name"] = json!(name);
    }
    if body["metadata"]["name"] != json!(name) {
        return Err(ApiError::BadRequest(
            "the name of the object does not match the name on the URL".into(),
        ));
    }
    let mut post = req.clone();
    post.body = body.to_string().into_bytes();
    post.headers.retain(|(k, _)| k != "content-type");
    post.headers
        .push(("content-type".into(), "application/json".into()));
    let target = Target {
        name: None,
        ..t.clone()
    };
    create(shared, &post, &target, user)
}

/// DeleteOptions from the body and the query.
fn delete_opts(req: &Request) -> Result<DeleteOpts, ApiError> {
    let body: Value = if req.body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        parse_body(req)?
    };
    delete_options(&body, |k| req.param(k))
}

/// DeleteOptions from a JSON body (`Null` when none), with query parameters from `param` where
/// the body leaves them out.
fn delete_options<'a>(
    body: &Value,
    param: impl Fn(&str) -> Option<&'a str>,
) -> Result<DeleteOpts, ApiError> {
    let grace_period = match &body["gracePeriodSeconds"] {
        Value::Null => match param("gracePeriodSeconds") {
            None => None,
            Some(g) => Some(g.parse::<i64>().map_err(|_| {
                ApiError::BadRequest(format!("gracePeriodSeconds: invalid value {g:?}"))
            })?),
        },
        v => Some(v.as_i64().ok_or_else(|| {
            ApiError::BadRequest(format!("gracePeriodSeconds: invalid value {v}"))
        })?),
    };
    let mut opts = DeleteOpts {
        uid: body["preconditions"]["uid"].as_str().map(String::from),
        resource_version: body["preconditions"]["resourceVersion"]
            .as_str()
            .map(String::from),
        grace_period,
        ..DeleteOpts::default()
    };
    let policy = body["propagationPolicy"]
        .as_str()
        .or(param("propagationPolicy"));
    let orphan =
        body["orphanDependents"].as_bool() == Some(true) || is_true(param("orphanDependents"));
    if policy == Some("Orphan") || (policy.is_none() && orphan) {
        opts.propagation = Propagation::Orphan;
    }
    match policy {
        None | Some("Orphan" | "Background" | "Foreground") => Ok(opts),
        Some(p) => Err(ApiError::invalid(
            "DeleteOptions",
            Details::default(),
            vec![Cause::not_supported(
                "propagationPolicy",
                &format!("{p:?}"),
                "\"Foreground\", \"Background\", \"Orphan\"",
            )],
        )),
    }
}

/// POST `pods/NAME/eviction` (a policy/v1 or v1beta1 Eviction, what `kubectl drain` sends):
/// the pod gets the condition DisruptionTarget (reason EvictionByEvictionAPI), then is deleted
/// as a DELETE with the Eviction's `deleteOptions` would be; answered 201 with a Status of
/// Success (fixtures 07, 08). There are no PodDisruptionBudgets to refuse it.
fn evict(shared: &Shared, req: &Request, t: &Target) -> Result<Reply, ApiError> {
    let body = parse_body(req)?;
    let name = t.name.as_deref().unwrap_or("");
    let ns = t.namespace.as_deref().unwrap_or("");
    if body["metadata"]["name"].as_str().unwrap_or("") != name {
        return Err(ApiError::BadRequest(
            "name in URL does not match name in Eviction object".into(),
        ));
    }
    let mut opts = delete_options(&body["deleteOptions"], |_| None)?;
    let mut store = shared.write();
    let def = lookup(&store, t, "create")?;
    let key = def.key();
    let mut cur = store
        .get(&key, ns, name)
        .ok_or_else(|| def.not_found(name))?;
    store.check_preconditions(&def, &cur, &opts)?;
    let mut next = (*cur).clone();
    let condition = json!({"type": "DisruptionTarget", "status": "True", "lastProbeTime": null,
        "lastTransitionTime": util::now_rfc3339(), "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting"});
    if crate::nodes::set_condition(&mut next, condition) {
        cur = store.update(&key, next, cur);
        if opts.resource_version.is_some() {
            // The eviction itself just moved the version the caller named.
            opts.resource_version = Some(meta_str(&cur, "resourceVersion").to_string());
        }
    }
    store.delete(&key, ns, name, &opts)?;
    drop(store);
    Ok(ok_value(
        201,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

/// Validating admission of deleting `cur` (operation DELETE: `oldObject` is the object,
/// `object` is null).
fn admit_delete(
    store: &Store,
    def: &ResourceDef,
    t: &Target,
    cur: &Value,
    user: &str,
) -> Result<Vec<String>, ApiError> {
    policy_admission::admit(
        store,
        &Attempt {
            operation: "DELETE",
            def,
            version: &t.version,
            subresource: None,
            namespace: meta_str(cur, "namespace"),
            name: meta_str(cur, "name"),
            object: None,
            old: Some(cur),
            user,
        },
    )
}

fn delete(shared: &Shared, req: &Request, t: &Target, user: &str) -> Result<Reply, ApiError> {
    let opts = delete_opts(req)?;
    let name = t.name.as_deref().unwrap_or("");
    let ns = t.namespace.as_deref().unwrap_or("");
    let mut store = shared.write();
    let def = lookup(&store, t, "delete")?;
    if t.sub.is_some() {
        return Err(not_served());
    }
    let key = def.key();
    let warnings = match store.get(&key, ns, name) {
        Some(cur) => admit_delete(&store, &def, t, &cur, user)?,
        None => Vec::new(),
    };
    let last = store.delete(&key, ns, name, &opts)?;
    let pending = store.get(&key, ns, name).is_some();
    drop(store);
    if pending || def.returns_deleted_object() {
        return Ok(with_warnings(
            ok_bytes(200, encode(&def, &t.version, &last)),
            warnings,
        ));
    }
    let status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "group": def.group, "kind": def.plural, "uid": meta_str(&last, "uid")},
    });
    Ok(with_warnings(ok_value(200, &status), warnings))
}

/// DELETE of a collection: every object matching the selectors, each deleted (and admitted) as
/// a single DELETE would be; an admission refusal ends the request with it, the objects before
/// it being deleted already. Answers the list of what was deleted.
fn delete_collection(
    shared: &Shared,
    req: &Request,
    t: &Target,
    user: &str,
) -> Result<Reply, ApiError> {
    let opts = delete_opts(req)?;
    let mut store = shared.write();
    let def = lookup(&store, t, "deletecollection")?;
    let (labels, fields) = selectors(req, &def, None)?;
    let key = def.key();
    let (items, _) = store.list(&key, t.namespace.as_deref(), None, 0, |o| {
        labels.matches_labels(o) && fields.matches_fields(o)
    });
    let mut deleted = Vec::with_capacity(items.len());
    for item in items {
        let (ns, name) = (
            meta_str(&item, "namespace").to_string(),
            meta_str(&item, "name").to_string(),
        );
        admit_delete(&store, &def, t, &item, user)?;
        match store.delete(&key, &ns, &name, &opts) {
            Ok(last) => deleted.push(last),
            Err(e) => {
                log::debug!(error = e.to_string().as_str(); "deletecollection skipped an object")
            }
        }
    }
    let rv = store.rv();
    drop(store);
    Ok(ok_bytes(
        200,
        encode_list(&def, &t.version, &deleted, rv, None),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let k = ("ns".to_string(), "name".to_string());
        assert_eq!(decode_continue(&encode_continue(42, &k)), Some((42, k)));
        assert_eq!(decode_continue("zz"), None);
    }
}
