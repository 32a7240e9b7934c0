//! Where a request's path leads: discovery, a resource verb's target, or nowhere.

/// A resource request's path, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub resource: String,
    pub name: Option<String>,
    pub sub: Option<String>,
}

impl Target {
    /// `pods` or `pods/status`, as counters and rules name it.
    pub fn label(&self) -> String {
        match &self.sub {
            Some(s) => format!("{}/{s}", self.resource),
            None => self.resource.clone(),
        }
    }
}

/// Where a path leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Version,
    Health,
    CoreVersions,
    GroupList,
    Group(String),
    ResourceList(String, String),
    Resource(Target),
    OpenApiRoot,
    OpenApi(String, String),
    Unknown,
}

/// Parses the path (`/api/v1/...`, `/apis/GROUP/VERSION/...`, discovery, /version).
pub fn parse_route(path: &str) -> Route {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Route::Version,
        ["healthz" | "livez" | "readyz", ..] => return Route::Health,
        ["api"] => return Route::CoreVersions,
        ["apis"] => return Route::GroupList,
        ["apis", g] => return Route::Group(g.to_string()),
        ["api", v] => return Route::ResourceList(String::new(), v.to_string()),
        ["apis", g, v] => return Route::ResourceList(g.to_string(), v.to_string()),
        ["openapi", "v3"] => return Route::OpenApiRoot,
        ["openapi", "v3", "api", v] => return Route::OpenApi(String::new(), v.to_string()),
        ["openapi", "v3", "apis", g, v] => return Route::OpenApi(g.to_string(), v.to_string()),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Route::Unknown,
    };
    // `namespaces/NS/RESOURCE...` unless it is the namespace object's own subresource
    // (`namespaces/NAME/status`, `namespaces/NAME/finalize`).
    let namespaced = rest.len() >= 3
        && rest[0] == "namespaces"
        && !(rest.len() == 3 && matches!(rest[2], "status" | "finalize"));
    let (namespace, rest) = if namespaced {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    let (resource, name, sub) = match rest {
        [r] => (*r, None, None),
        [r, n] => (*r, Some(n.to_string()), None),
        [r, n, s] => (*r, Some(n.to_string()), Some(s.to_string())),
        _ => return Route::Unknown,
    };
    Route::Resource(Target {
        group: group.to_string(),
        version: version.to_string(),
        namespace,
        resource: resource.to_string(),
        name,
        sub,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(
        group: &str,
        version: &str,
        ns: Option<&str>,
        resource: &str,
        name: Option<&str>,
        sub: Option<&str>,
    ) -> Route {
        Route::Resource(Target {
            group: group.into(),
            version: version.into(),
            namespace: ns.map(String::from),
            resource: resource.into(),
            name: name.map(String::from),
            sub: sub.map(String::from),
        })
    }

    #[test]
    fn paths_route_to_resources_and_discovery() {
        assert_eq!(
            parse_route("/api/v1/pods"),
            target("", "v1", None, "pods", None, None)
        );
        assert_eq!(
            parse_route("/api/v1/namespaces/default/pods/p/status"),
            target("", "v1", Some("default"), "pods", Some("p"), Some("status"))
        );
        assert_eq!(
            parse_route("/api/v1/namespaces/foo"),
            target("", "v1", None, "namespaces", Some("foo"), None)
        );
        assert_eq!(
            parse_route("/api/v1/namespaces/foo/status"),
            target("", "v1", None, "namespaces", Some("foo"), Some("status"))
        );
        assert_eq!(
            parse_route("/api/v1/namespaces/foo/pods"),
            target("", "v1", Some("foo"), "pods", None, None)
        );
        assert_eq!(
            parse_route("/apis/immortalcontainer.flugel.it/v1alpha1/namespaces/x/immortalcontainers/e/status"),
            target("immortalcontainer.flugel.it", "v1alpha1", Some("x"), "immortalcontainers", Some("e"), Some("status"))
        );
        assert_eq!(parse_route("/apis/g"), Route::Group("g".into()));
        assert_eq!(
            parse_route("/apis/g/v1"),
            Route::ResourceList("g".into(), "v1".into())
        );
        assert_eq!(parse_route("/version"), Route::Version);
        assert_eq!(parse_route("/openapi/v2"), Route::Unknown);
        assert_eq!(
            parse_route("/openapi/v3/apis/g/v1"),
            Route::OpenApi("g".into(), "v1".into())
        );
    }
}
