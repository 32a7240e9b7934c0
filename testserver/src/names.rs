//! Name and label syntax as apimachinery checks it (DNS-1123 subdomains and labels, DNS-1035
//! labels, label values, qualified names), with its messages.

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const NAME_PART_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

/// A JSON-quoted value, the way Go's `%q` prints a string in "Invalid value" messages.
pub fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, without the length limit.
fn is_label_shape(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && is_lower_alnum(b[0])
        && is_lower_alnum(b[b.len() - 1])
        && b.iter().all(|c| is_lower_alnum(*c) || *c == b'-')
}

/// Errors of a DNS-1123 subdomain (object names): at most 253 characters, dot-separated labels.
pub fn subdomain_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push("must be no more than 253 characters".to_string());
    }
    if !s.split('.').all(is_label_shape) {
        errs.push(SUBDOMAIN_MSG.to_string());
    }
    errs
}

/// Errors of a DNS-1123 label (namespace and container names): at most 63 characters.
pub fn label_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !is_label_shape(s) {
        errs.push(LABEL_MSG.to_string());
    }
    errs
}

/// Errors of a DNS-1035 label (Service names): a DNS-1123 label that starts with a letter.
pub fn dns1035_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !is_label_shape(s) || !s.as_bytes()[0].is_ascii_lowercase() {
        errs.push(DNS1035_MSG.to_string());
    }
    errs
}

/// Errors of a name that only has to be a URL path segment (`path.IsValidPathSegmentName`): what
/// RBAC asks of role and binding names, so `system:controller:x` is a valid ClusterRole name.
pub fn path_segment_errors(s: &str) -> Vec<String> {
    if s == "." || s == ".." {
        return vec![format!("may not be '{s}'")];
    }
    ["/", "%"]
        .iter()
        .filter(|c| s.contains(**c))
        .map(|c| format!("may not contain '{c}'"))
        .collect()
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`: the name part of label keys, and label values.
fn is_label_value_shape(s: &str) -> bool {
    let b = s.as_bytes();
    b.is_empty()
        || (b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.')))
}

/// Errors of a label value: empty, or at most 63 characters of the label-value shape.
pub fn label_value_errors(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if v.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !is_label_value_shape(v) {
        errs.push(LABEL_VALUE_MSG.to_string());
    }
    errs
}

/// Errors of a qualified name (label and annotation keys): `[prefix/]name`, where prefix is a
/// DNS subdomain and name at most 63 characters of the label-value shape, non-empty.
pub fn qualified_name_errors(k: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let (prefix, name) = match k.split('/').collect::<Vec<_>>().as_slice() {
        [name] => (None, *name),
        [prefix, name] => (Some(*prefix), *name),
        _ => {
            return vec![format!(
                "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            )]
        }
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            errs.push("prefix part must be non-empty".to_string());
        } else {
            errs.extend(
                subdomain_errors(p)
                    .into_iter()
                    .map(|e| format!("prefix part {e}")),
            );
        }
    }
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else {
        if name.len() > 63 {
            errs.push("name part must be no more than 63 characters".to_string());
        }
        if !is_label_value_shape(name) {
            errs.push(NAME_PART_MSG.to_string());
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_dns1123() {
        assert!(subdomain_errors("example.com").is_empty());
        assert!(!subdomain_errors("Bad_Name").is_empty());
        assert!(!subdomain_errors(&"a".repeat(254)).is_empty());
        assert!(subdomain_errors(&"a".repeat(253)).is_empty());
        assert!(!label_errors("a.b").is_empty());
    }

    #[test]
    fn label_value_over_63_is_rejected_like_fixture_13() {
        let errs = label_value_errors(&"a".repeat(70));
        assert_eq!(errs, vec!["must be no more than 63 characters".to_string()]);
        assert!(label_value_errors("").is_empty());
        assert!(!label_value_errors("-x").is_empty());
        assert!(qualified_name_errors("immortalcontainer.flugel.it/owner-uid").is_empty());
        assert!(!qualified_name_errors("a/b/c").is_empty());
    }
}
