//! The few CEL expressions CRD validation rules (`x-kubernetes-validations`, GA since 1.25) are
//! written with here, evaluated as kube-apiserver does: `self` bound to the value at the rule's
//! place in the schema; a rule that is false refuses the write with 422 Invalid and the rule's
//! message (the `*-cel-rule-rejects-long-name` fixture).
//!
//! Not CEL: a small subset, on purpose. `self` and field selection, `has(...)`, integer and
//! string literals, `!`, `&&`, `||`, comparisons (`==`, `!=`, `<`, `<=`, `>`, `>=`), and the
//! string methods `size()`, `trim()`, `contains()`, `startsWith()`, `endsWith()`. A rule outside
//! it is refused when the CRD is created, with a message saying so, rather than skipped.

use serde_json::Value;
use std::fmt;

/// A parsed rule.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    SelfRef,
    Int(i64),
    Str(String),
    Field(Box<Expr>, String),
    Has(Box<Expr>),
    Call(Box<Expr>, Method, Vec<Expr>),
    Not(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Cmp(Box<Expr>, Op, Box<Expr>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Size,
    Trim,
    Contains,
    StartsWith,
    EndsWith,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A value during evaluation.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Bool(bool),
    Int(i64),
    Str(String),
    Json(Value),
}

impl fmt::Display for Val {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Val::Bool(b) => write!(f, "{b}"),
            Val::Int(i) => write!(f, "{i}"),
            Val::Str(s) => write!(f, "{s:?}"),
            Val::Json(v) => write!(f, "{v}"),
        }
    }
}

fn from_json(v: &Value) -> Val {
    match v {
        Value::Bool(b) => Val::Bool(*b),
        Value::Number(n) if n.is_i64() => Val::Int(n.as_i64().unwrap_or(0)),
        Value::String(s) => Val::Str(s.clone()),
        other => Val::Json(other.clone()),
    }
}

// ------------------------------------------------------------------------------------------
// Parsing

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Int(i64),
    Str(String),
    Punct(&'static str),
}

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            out.push(Tok::Int(
                text.parse().map_err(|_| format!("bad integer {text}"))?,
            ));
        } else if c == '\'' || c == '"' {
            let quote = c;
            i += 1;
            let mut s = String::new();
            while i < chars.len() && chars[i] != quote {
                if chars[i] == '\\' {
                    i += 1;
                    match chars.get(i) {
                        Some('\\') => s.push('\\'),
                        Some('\'') => s.push('\''),
                        Some('"') => s.push('"'),
                        Some('n') => s.push('\n'),
                        Some('t') => s.push('\t'),
                        other => return Err(format!("unsupported escape \\{other:?}")),
                    }
                } else {
                    s.push(chars[i]);
                }
                i += 1;
            }
            if i == chars.len() {
                return Err("unterminated string".into());
            }
            i += 1;
            out.push(Tok::Str(s));
        } else {
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            let p = match two.as_str() {
                "&&" => "&&",
                "||" => "||",
                "==" => "==",
                "!=" => "!=",
                "<=" => "<=",
                ">=" => ">=",
                _ => match c {
                    '!' => "!",
                    '<' => "<",
                    '>' => ">",
                    '.' => ".",
                    '(' => "(",
                    ')' => ")",
                    ',' => ",",
                    other => return Err(format!("unsupported character {other:?}")),
                },
            };
            i += p.len();
            out.push(Tok::Punct(p));
        }
    }
    Ok(out)
}

struct Parser {
    toks: Vec<Tok>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }
    fn eat(&mut self, p: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Punct(q)) if *q == p) {
            self.at += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, p: &str) -> Result<(), String> {
        if self.eat(p) {
            Ok(())
        } else {
            Err(format!("expected {p:?} at token {}", self.at))
        }
    }
    fn or(&mut self) -> Result<Expr, String> {
        let mut e = self.and()?;
        while self.eat("||") {
            e = Expr::Or(Box::new(e), Box::new(self.and()?));
        }
        Ok(e)
    }
    fn and(&mut self) -> Result<Expr, String> {
        let mut e = self.not()?;
        while self.eat("&&") {
            e = Expr::And(Box::new(e), Box::new(self.not()?));
        }
        Ok(e)
    }
    fn not(&mut self) -> Result<Expr, String> {
        if self.eat("!") {
            return Ok(Expr::Not(Box::new(self.not()?)));
        }
        self.cmp()
    }
    fn cmp(&mut self) -> Result<Expr, String> {
        let left = self.term()?;
        let op = match self.peek() {
            Some(Tok::Punct("==")) => Op::Eq,
            Some(Tok::Punct("!=")) => Op::Ne,
            Some(Tok::Punct("<")) => Op::Lt,
            Some(Tok::Punct("<=")) => Op::Le,
            Some(Tok::Punct(">")) => Op::Gt,
            Some(Tok::Punct(">=")) => Op::Ge,
            _ => return Ok(left),
        };
        self.at += 1;
        Ok(Expr::Cmp(Box::new(left), op, Box::new(self.term()?)))
    }
    fn term(&mut self) -> Result<Expr, String> {
        let mut e = self.atom()?;
        while self.eat(".") {
            let Some(Tok::Ident(name)) = self.peek().cloned() else {
                return Err("expected a name after '.'".into());
            };
            self.at += 1;
            if self.eat("(") {
                let method = match name.as_str() {
                    "size" => Method::Size,
                    "trim" => Method::Trim,
                    "contains" => Method::Contains,
                    "startsWith" => Method::StartsWith,
                    "endsWith" => Method::EndsWith,
                    other => return Err(format!("the test server does not evaluate {other}()")),
                };
                let mut args = Vec::new();
                if !self.eat(")") {
                    loop {
                        args.push(self.or()?);
                        if self.eat(")") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
                let want = match method {
                    Method::Size | Method::Trim => 0,
                    _ => 1,
                };
                if args.len() != want {
                    return Err(format!("{name}() takes {want} argument(s)"));
                }
                e = Expr::Call(Box::new(e), method, args);
            } else {
                e = Expr::Field(Box::new(e), name);
            }
        }
        Ok(e)
    }
    fn atom(&mut self) -> Result<Expr, String> {
        match self.peek().cloned() {
            Some(Tok::Ident(i)) if i == "self" => {
                self.at += 1;
                Ok(Expr::SelfRef)
            }
            Some(Tok::Ident(i)) if i == "has" => {
                self.at += 1;
                self.expect("(")?;
                let inner = self.term()?;
                self.expect(")")?;
                if !matches!(inner, Expr::Field(..)) {
                    return Err("has() takes a field selection".into());
                }
                Ok(Expr::Has(Box::new(inner)))
            }
            Some(Tok::Int(n)) => {
                self.at += 1;
                Ok(Expr::Int(n))
            }
            Some(Tok::Str(s)) => {
                self.at += 1;
                Ok(Expr::Str(s))
            }
            Some(Tok::Punct("(")) => {
                self.at += 1;
                let e = self.or()?;
                self.expect(")")?;
                Ok(e)
            }
            other => Err(format!("unexpected {other:?}")),
        }
    }
}

/// Parses `rule`, or says why the test server cannot evaluate it.
pub fn parse(rule: &str) -> Result<Expr, String> {
    let toks = lex(rule)?;
    let mut p = Parser { toks, at: 0 };
    let e = p.or()?;
    if p.at != p.toks.len() {
        return Err(format!("unexpected input after token {}", p.at));
    }
    Ok(e)
}

// ------------------------------------------------------------------------------------------
// Evaluation

fn eval(e: &Expr, this: &Value) -> Result<Val, String> {
    Ok(match e {
        Expr::SelfRef => from_json(this),
        Expr::Int(n) => Val::Int(*n),
        Expr::Str(s) => Val::Str(s.clone()),
        Expr::Field(obj, name) => match eval(obj, this)? {
            Val::Json(Value::Object(m)) => match m.get(name) {
                Some(v) => from_json(v),
                None => return Err(format!("no such key: {name}")),
            },
            other => return Err(format!("no such key: {name} (on {other})")),
        },
        Expr::Has(inner) => {
            let Expr::Field(obj, name) = inner.as_ref() else {
                return Err("has() takes a field selection".into());
            };
            match eval(obj, this)? {
                Val::Json(Value::Object(m)) => Val::Bool(m.contains_key(name)),
                _ => Val::Bool(false),
            }
        }
        Expr::Call(target, method, args) => {
            let Val::Str(s) = eval(target, this)? else {
                return Err(format!("{method:?} applies to strings"));
            };
            let arg = |i: usize| -> Result<String, String> {
                match eval(&args[i], this)? {
                    Val::Str(a) => Ok(a),
                    other => Err(format!("expected a string argument, got {other}")),
                }
            };
            match method {
                // CEL strings count code points.
                Method::Size => Val::Int(s.chars().count() as i64),
                Method::Trim => Val::Str(s.trim().to_string()),
                Method::Contains => Val::Bool(s.contains(arg(0)?.as_str())),
                Method::StartsWith => Val::Bool(s.starts_with(arg(0)?.as_str())),
                Method::EndsWith => Val::Bool(s.ends_with(arg(0)?.as_str())),
            }
        }
        Expr::Not(inner) => match eval(inner, this)? {
            Val::Bool(b) => Val::Bool(!b),
            other => return Err(format!("! applies to bools, not {other}")),
        },
        Expr::And(a, b) => match eval(a, this)? {
            Val::Bool(false) => Val::Bool(false),
            Val::Bool(true) => eval(b, this)?,
            other => return Err(format!("&& applies to bools, not {other}")),
        },
        Expr::Or(a, b) => match eval(a, this)? {
            Val::Bool(true) => Val::Bool(true),
            Val::Bool(false) => eval(b, this)?,
            other => return Err(format!("|| applies to bools, not {other}")),
        },
        Expr::Cmp(a, op, b) => {
            let (a, b) = (eval(a, this)?, eval(b, this)?);
            let ord = match (&a, &b) {
                (Val::Int(x), Val::Int(y)) => x.cmp(y),
                (Val::Str(x), Val::Str(y)) => x.cmp(y),
                (Val::Bool(x), Val::Bool(y)) if matches!(op, Op::Eq | Op::Ne) => x.cmp(y),
                _ => return Err(format!("cannot compare {a} and {b}")),
            };
            use std::cmp::Ordering::*;
            Val::Bool(match op {
                Op::Eq => ord == Equal,
                Op::Ne => ord != Equal,
                Op::Lt => ord == Less,
                Op::Le => ord != Greater,
                Op::Gt => ord == Greater,
                Op::Ge => ord != Less,
            })
        }
    })
}

/// Whether `rule` holds for `this`. A rule that cannot be evaluated (a field missing without
/// `has()`) does not hold, as on a real server, where it is a validation error too.
pub fn holds(rule: &Expr, this: &Value) -> Result<bool, String> {
    match eval(rule, this)? {
        Val::Bool(b) => Ok(b),
        other => Err(format!("the rule evaluated to {other}, not a bool")),
    }
}

/// The `reason`s a rule may give (Kubernetes 1.28+), as kube-apiserver lists them.
const REASONS: [&str; 4] = [
    "FieldValueDuplicate",
    "FieldValueForbidden",
    "FieldValueInvalid",
    "FieldValueRequired",
];

/// Checks, when a CRD is written, that every rule in `schema` is one the test server can
/// evaluate; the others are refused, as kube-apiserver refuses a rule that does not compile.
/// A rule's `reason` must be one of [`REASONS`] and its `fieldPath` must name a field the
/// schema declares below the rule, as kube-apiserver 1.28 checks (`.a.b` paths only here).
pub fn compile_rules(schema: &Value, field: &str, causes: &mut Vec<crate::status::Cause>) {
    if let Some(rules) = schema["x-kubernetes-validations"].as_array() {
        for (i, r) in rules.iter().enumerate() {
            let rule = r["rule"].as_str().unwrap_or("");
            if let Err(e) = parse(rule) {
                causes.push(crate::status::Cause::invalid(
                    &format!("{field}.x-kubernetes-validations[{i}].rule"),
                    &format!("{rule:?}"),
                    &format!("compilation failed: the test server evaluates a small CEL subset only (testserver/src/cel.rs): {e}"),
                ));
            }
            if let Some(reason) = r["reason"].as_str() {
                if !REASONS.contains(&reason) {
                    let supported = REASONS.map(|r| format!("{r:?}")).join(", ");
                    causes.push(crate::status::Cause::not_supported(
                        &format!("{field}.x-kubernetes-validations[{i}].reason"),
                        &format!("{reason:?}"),
                        &supported,
                    ));
                }
            }
            if let Some(path) = r["fieldPath"].as_str() {
                if field_path(schema, path).is_none() {
                    causes.push(crate::status::Cause::invalid(
                        &format!("{field}.x-kubernetes-validations[{i}].fieldPath"),
                        &format!("{path:?}"),
                        "fieldPath must be a valid path",
                    ));
                }
            }
        }
    }
    let nested = ["properties", "additionalProperties"];
    for key in nested {
        if let Some(props) = schema[key].as_object() {
            if key == "additionalProperties" {
                compile_rules(
                    &schema[key],
                    &format!("{field}.additionalProperties"),
                    causes,
                );
                continue;
            }
            for (name, sub) in props {
                compile_rules(sub, &format!("{field}.properties[{name}]"), causes);
            }
        }
    }
    if schema["items"].is_object() {
        compile_rules(&schema["items"], &format!("{field}.items"), causes);
    }
}

/// `fieldPath` (`.a.b`) as the field path it reports (`a.b`), if it names properties the
/// schema declares; `None` otherwise, as kube-apiserver's `ValidFieldPath` refuses a path to
/// anything undeclared (so a rule on the root can name `.metadata.name` only once the schema
/// declares `metadata.properties.name`).
fn field_path(schema: &Value, path: &str) -> Option<String> {
    let mut node = schema;
    let mut names = Vec::new();
    for name in path.strip_prefix('.')?.split('.') {
        node = node["properties"].get(name)?;
        names.push(name);
    }
    Some(names.join("."))
}

/// The causes `value` earns from the rules of its schema node, as kube-apiserver reports a
/// rule that does not hold: at `field` (`<nil>` at the root), or at the rule's `fieldPath`
/// below it; with its `reason`, `FIELD: Invalid value: "TYPE": MESSAGE` by default (the value
/// shown is the type of the rule's schema node, even with a `fieldPath`), `FIELD: Forbidden:
/// MESSAGE`, `FIELD: Required value: MESSAGE` or `FIELD: Duplicate value: "TYPE"`.
pub fn rule_causes(
    schema: &Value,
    value: &Value,
    field: &str,
    causes: &mut Vec<crate::status::Cause>,
) {
    use crate::status::Cause;
    let Some(rules) = schema["x-kubernetes-validations"].as_array() else {
        return;
    };
    let type_ = format!("{:?}", schema["type"].as_str().unwrap_or("object"));
    for r in rules {
        let rule = r["rule"].as_str().unwrap_or("");
        let message = r["message"]
            .as_str()
            .map(String::from)
            .unwrap_or_else(|| format!("failed rule: {rule}"));
        let verdict = parse(rule).and_then(|e| holds(&e, value));
        let detail = match verdict {
            Ok(true) => continue,
            Ok(false) => message,
            Err(e) => {
                // Not the rule's verdict but a failure to reach one: always Invalid, at the node.
                causes.push(Cause::invalid(
                    field,
                    &type_,
                    &format!("{e} evaluating rule: {rule}"),
                ));
                continue;
            }
        };
        let at = match r["fieldPath"].as_str().and_then(|p| field_path(schema, p)) {
            Some(sub) if field == "<nil>" => sub,
            Some(sub) => format!("{field}.{sub}"),
            None => field.to_string(),
        };
        causes.push(match r["reason"].as_str() {
            Some("FieldValueForbidden") => Cause::forbidden(&at, &detail),
            Some("FieldValueRequired") => Cause::required(&at, &detail),
            Some("FieldValueDuplicate") => Cause::duplicate(&at, &type_),
            _ => Cause::invalid(&at, &type_, &detail),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(rule: &str, this: Value) -> Result<bool, String> {
        holds(&parse(rule)?, &this)
    }

    #[test]
    fn the_rules_of_our_crd_evaluate_as_on_a_real_server() {
        let ic = |name: &str| json!({"metadata": {"name": name}, "spec": {"image": "nginx"}});
        let rule = "self.metadata.name.size() <= 241";
        assert_eq!(check(rule, ic(&"a".repeat(241))), Ok(true));
        assert_eq!(check(rule, ic(&"a".repeat(242))), Ok(false));
        let image = "self.image.trim() == self.image && !self.image.contains(' ')";
        assert_eq!(check(image, json!({"image": "nginx:1.27"})), Ok(true));
        assert_eq!(check(image, json!({"image": " nginx"})), Ok(false));
        assert_eq!(check(image, json!({"image": "nginx latest"})), Ok(false));
        assert_eq!(check(image, json!({"image": "\t"})), Ok(false));
    }

    #[test]
    fn operators_short_circuit_and_has_guards_a_missing_field() {
        assert_eq!(check("has(self.x) && self.x > 1", json!({})), Ok(false));
        assert_eq!(check("!has(self.x) || self.x > 1", json!({})), Ok(true));
        assert_eq!(
            check("self.x >= 2 && self.x != 3", json!({"x": 2})),
            Ok(true)
        );
        assert_eq!(
            check(
                "self.s.startsWith('ab') && self.s.endsWith(\"z\")",
                json!({"s": "abz"})
            ),
            Ok(true)
        );
        assert!(
            check("self.x > 1", json!({})).is_err(),
            "a missing field is an error"
        );
        // CEL counts characters, not bytes.
        assert_eq!(check("self.s.size() == 2", json!({"s": "äö"})), Ok(true));
    }

    #[test]
    fn a_crd_whose_rule_the_test_server_cannot_evaluate_is_refused_not_skipped() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
            "x-kubernetes-validations": [{"rule": "self.image.matches('^x')"}]}}});
        let mut causes = Vec::new();
        compile_rules(
            &schema,
            "spec.versions[0].schema.openAPIV3Schema",
            &mut causes,
        );
        assert_eq!(causes.len(), 1);
        assert_eq!(
            causes[0].field,
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule"
        );
        assert!(
            causes[0].message.contains("compilation failed"),
            "{}",
            causes[0].message
        );
        // Ours compile.
        let ours: Value =
            serde_yaml::from_str(include_str!("../../config/crd/immortalcontainers.yaml")).unwrap();
        let mut causes = Vec::new();
        compile_rules(
            &ours["spec"]["versions"][0]["schema"]["openAPIV3Schema"],
            "x",
            &mut causes,
        );
        assert!(causes.is_empty(), "{causes:?}");
    }

    #[test]
    fn a_field_path_and_reason_say_where_and_how_a_rule_refuses() {
        let schema = json!({"type": "object",
            "properties": {"metadata": {"type": "object", "properties": {"name": {"type": "string"}}}},
            "x-kubernetes-validations": [
                {"rule": "self.metadata.name.size() <= 3", "message": "too long",
                 "fieldPath": ".metadata.name", "reason": "FieldValueForbidden"},
                {"rule": "self.metadata.name.size() <= 2", "message": "still too long"}]});
        let mut causes = Vec::new();
        rule_causes(
            &schema,
            &json!({"metadata": {"name": "abcd"}}),
            "<nil>",
            &mut causes,
        );
        let got: Vec<_> = causes
            .iter()
            .map(|c| (c.reason.as_str(), c.field.as_str(), c.message.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "FieldValueForbidden",
                    "metadata.name",
                    "Forbidden: too long"
                ),
                (
                    "FieldValueInvalid",
                    "<nil>",
                    "Invalid value: \"object\": still too long"
                ),
            ]
        );
        // Nested, the path is below the rule's own field.
        let spec = json!({"type": "object", "properties": {"image": {"type": "string"}},
            "x-kubernetes-validations": [{"rule": "!self.image.contains(' ')", "message": "m",
                "fieldPath": ".image"}]});
        let mut causes = Vec::new();
        rule_causes(&spec, &json!({"image": "a b"}), "spec", &mut causes);
        assert_eq!(causes[0].field, "spec.image");
        assert_eq!(causes[0].message, "Invalid value: \"object\": m");
    }

    #[test]
    fn a_field_path_to_an_undeclared_field_or_an_unknown_reason_is_refused() {
        // As kube-apiserver: `.metadata.name` needs metadata.properties.name in the schema.
        let schema = json!({"type": "object", "properties": {"metadata": {"type": "object"}},
            "x-kubernetes-validations": [{"rule": "self.metadata.name.size() <= 3",
                "fieldPath": ".metadata.name", "reason": "FieldValueTooLong"}]});
        let mut causes = Vec::new();
        compile_rules(&schema, "s", &mut causes);
        let fields: Vec<_> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "s.x-kubernetes-validations[0].reason",
                "s.x-kubernetes-validations[0].fieldPath"
            ]
        );
        assert!(causes[1].message.contains("fieldPath must be a valid path"));
    }

    #[test]
    fn a_rule_outside_the_subset_is_refused_with_a_reason() {
        let e = parse("self.image.matches('^x$')").unwrap_err();
        assert!(e.contains("matches"), "{e}");
        assert!(parse("self.x + 1 > 2").is_err());
        assert!(parse("self.x ? 1 : 2").is_err());
    }
}
