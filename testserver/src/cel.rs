//! The CEL expressions the test server evaluates, as kube-apiserver does: CRD validation rules
//! (`x-kubernetes-validations`, GA since 1.25), with `self` bound to the value at the rule's
//! place in the schema (a rule that is false refuses the write with 422 Invalid and the rule's
//! message, the `*-cel-rule-rejects-long-name` fixture), and ValidatingAdmissionPolicy
//! expressions (`policy.rs`), with `object`, `oldObject`, `request` and `namespaceObject`.
//!
//! Not CEL: a small subset, on purpose. Variables and field selection, `[...]` indexing of maps
//! and lists, `has(...)`, integer, string, `true`, `false`, `null` and list literals, `!`,
//! `&&`, `||` (with CEL's commutative handling of errors), comparisons (`==`, `!=`, `<`, `<=`,
//! `>`, `>=`; equality across types is false, as CEL's heterogeneous equality has it), `in`,
//! `size()` (strings, lists, maps, as a method or a function), the string methods `trim()`,
//! `contains()`, `startsWith()`, `endsWith()`, `matches()` (a string literal in the RE2
//! subset of `regex.rs`), and the macros `all()`, `exists()` and
//! `exists_one()` over lists (and map keys). An expression outside it is refused when its CRD
//! or policy is written, with a message saying so, rather than skipped or half-checked.

use serde_json::Value;
use std::fmt;

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A declared variable (`self`, `object`...) or one a macro binds.
    Var(String),
    Int(i64),
    Str(String),
    Bool(bool),
    Null,
    List(Vec<Expr>),
    Field(Box<Expr>, String),
    Index(Box<Expr>, Box<Expr>),
    Has(Box<Expr>),
    Call(Box<Expr>, Method, Vec<Expr>),
    /// `target.all(var, predicate)` and friends.
    Macro(Box<Expr>, Quantifier, String, Box<Expr>),
    Not(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Cmp(Box<Expr>, Op, Box<Expr>),
    In(Box<Expr>, Box<Expr>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Size,
    Trim,
    Contains,
    StartsWith,
    EndsWith,
    /// RE2 search, the pattern a literal compiled when the rule is.
    Matches,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantifier {
    All,
    Exists,
    ExistsOne,
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

/// A value during evaluation. Maps, lists and non-integer numbers stay JSON.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Bool(bool),
    Int(i64),
    Str(String),
    Null,
    Json(Value),
}

impl fmt::Display for Val {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Val::Bool(b) => write!(f, "{b}"),
            Val::Int(i) => write!(f, "{i}"),
            Val::Str(s) => write!(f, "{s:?}"),
            Val::Null => write!(f, "null"),
            Val::Json(v) => write!(f, "{v}"),
        }
    }
}

pub fn from_json(v: &Value) -> Val {
    match v {
        Value::Null => Val::Null,
        Value::Bool(b) => Val::Bool(*b),
        Value::Number(n) if n.is_i64() => Val::Int(n.as_i64().unwrap_or(0)),
        Value::String(s) => Val::Str(s.clone()),
        other => Val::Json(other.clone()),
    }
}

fn to_json(v: Val) -> Value {
    match v {
        Val::Bool(b) => Value::Bool(b),
        Val::Int(i) => Value::from(i),
        Val::Str(s) => Value::String(s),
        Val::Null => Value::Null,
        Val::Json(j) => j,
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
                    '[' => "[",
                    ']' => "]",
                    ',' => ",",
                    '-' => "-",
                    other => return Err(format!("unsupported character {other:?}")),
                },
            };
            i += p.len();
            out.push(Tok::Punct(p));
        }
    }
    Ok(out)
}

struct Parser<'a> {
    toks: Vec<Tok>,
    at: usize,
    /// The variables in scope: the declared ones, then those of the macros around.
    scope: Vec<String>,
    declared: &'a [&'a str],
}

impl Parser<'_> {
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
            Some(Tok::Ident(i)) if i == "in" => {
                self.at += 1;
                return Ok(Expr::In(Box::new(left), Box::new(self.term()?)));
            }
            _ => return Ok(left),
        };
        self.at += 1;
        Ok(Expr::Cmp(Box::new(left), op, Box::new(self.term()?)))
    }
    /// Arguments up to the closing `)` (the `(` already eaten).
    fn args(&mut self) -> Result<Vec<Expr>, String> {
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
        Ok(args)
    }
    fn term(&mut self) -> Result<Expr, String> {
        let mut e = self.atom()?;
        loop {
            if self.eat("[") {
                let index = self.or()?;
                self.expect("]")?;
                e = Expr::Index(Box::new(e), Box::new(index));
                continue;
            }
            if !self.eat(".") {
                return Ok(e);
            }
            let Some(Tok::Ident(name)) = self.peek().cloned() else {
                return Err("expected a name after '.'".into());
            };
            self.at += 1;
            if !self.eat("(") {
                e = Expr::Field(Box::new(e), name);
                continue;
            }
            let quantifier = match name.as_str() {
                "all" => Some(Quantifier::All),
                "exists" => Some(Quantifier::Exists),
                "exists_one" => Some(Quantifier::ExistsOne),
                _ => None,
            };
            if let Some(q) = quantifier {
                let Some(Tok::Ident(var)) = self.peek().cloned() else {
                    return Err(format!("{name}() takes a variable name first"));
                };
                self.at += 1;
                self.expect(",")?;
                self.scope.push(var.clone());
                let body = self.or();
                self.scope.pop();
                let body = body?;
                self.expect(")")?;
                e = Expr::Macro(Box::new(e), q, var, Box::new(body));
                continue;
            }
            let method = match name.as_str() {
                "size" => Method::Size,
                "trim" => Method::Trim,
                "contains" => Method::Contains,
                "startsWith" => Method::StartsWith,
                "endsWith" => Method::EndsWith,
                "matches" => Method::Matches,
                other => return Err(format!("the test server does not evaluate {other}()")),
            };
            let args = self.args()?;
            let want = match method {
                Method::Size | Method::Trim => 0,
                _ => 1,
            };
            if args.len() != want {
                return Err(format!("{name}() takes {want} argument(s)"));
            }
            if method == Method::Matches {
                // Only a literal pattern can be checked when the rule is written.
                let Expr::Str(pattern) = &args[0] else {
                    return Err("matches() takes a string literal pattern".into());
                };
                crate::regex::Regex::new(pattern)
                    .map_err(|e| format!("matches() pattern {pattern:?}: {e}"))?;
            }
            e = Expr::Call(Box::new(e), method, args);
        }
    }
    fn atom(&mut self) -> Result<Expr, String> {
        match self.peek().cloned() {
            Some(Tok::Ident(i)) => {
                self.at += 1;
                match i.as_str() {
                    "true" => Ok(Expr::Bool(true)),
                    "false" => Ok(Expr::Bool(false)),
                    "null" => Ok(Expr::Null),
                    "has" => {
                        self.expect("(")?;
                        let inner = self.term()?;
                        self.expect(")")?;
                        if !matches!(inner, Expr::Field(..)) {
                            return Err("has() takes a field selection".into());
                        }
                        Ok(Expr::Has(Box::new(inner)))
                    }
                    "size" if self.eat("(") => {
                        let mut args = self.args()?;
                        if args.len() != 1 {
                            return Err("size() takes 1 argument".into());
                        }
                        Ok(Expr::Call(
                            Box::new(args.remove(0)),
                            Method::Size,
                            Vec::new(),
                        ))
                    }
                    name if self.scope.iter().any(|v| v == name)
                        || self.declared.contains(&name) =>
                    {
                        Ok(Expr::Var(i))
                    }
                    name => Err(format!("undeclared reference to '{name}'")),
                }
            }
            Some(Tok::Int(n)) => {
                self.at += 1;
                Ok(Expr::Int(n))
            }
            Some(Tok::Punct("-")) => {
                self.at += 1;
                match self.peek().cloned() {
                    Some(Tok::Int(n)) => {
                        self.at += 1;
                        Ok(Expr::Int(-n))
                    }
                    _ => Err("'-' only negates an integer literal here".into()),
                }
            }
            Some(Tok::Str(s)) => {
                self.at += 1;
                Ok(Expr::Str(s))
            }
            Some(Tok::Punct("[")) => {
                self.at += 1;
                let mut items = Vec::new();
                if !self.eat("]") {
                    loop {
                        items.push(self.or()?);
                        if self.eat("]") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
                Ok(Expr::List(items))
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

/// Parses `src` with the variables `declared`, or says why the test server cannot evaluate it.
pub fn parse_with(src: &str, declared: &[&str]) -> Result<Expr, String> {
    let toks = lex(src)?;
    let mut p = Parser {
        toks,
        at: 0,
        scope: Vec::new(),
        declared,
    };
    let e = p.or()?;
    if p.at != p.toks.len() {
        return Err(format!("unexpected input after token {}", p.at));
    }
    Ok(e)
}

/// Parses a CRD validation rule (`self` declared).
pub fn parse(rule: &str) -> Result<Expr, String> {
    parse_with(rule, &["self"])
}

// ------------------------------------------------------------------------------------------
// Evaluation

/// Variable bindings: the declared ones first, then those of the macros being evaluated.
pub type Bindings = Vec<(String, Val)>;

fn lookup(env: &Bindings, name: &str) -> Result<Val, String> {
    env.iter()
        .rev()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.clone())
        .ok_or_else(|| format!("no such attribute: {name}"))
}

/// `==` as CEL's heterogeneous equality: values of different types are not equal; numbers
/// compare by value.
fn equal(a: &Val, b: &Val) -> bool {
    match (a, b) {
        (Val::Int(x), Val::Json(Value::Number(y))) | (Val::Json(Value::Number(y)), Val::Int(x)) => {
            y.as_f64() == Some(*x as f64)
        }
        (Val::Json(Value::Number(x)), Val::Json(Value::Number(y))) => x.as_f64() == y.as_f64(),
        _ => to_json(a.clone()) == to_json(b.clone()),
    }
}

/// The elements a macro ranges over: a list's items, a map's keys.
fn range(v: Val, what: &str) -> Result<Vec<Val>, String> {
    match v {
        Val::Json(Value::Array(items)) => Ok(items.iter().map(from_json).collect()),
        Val::Json(Value::Object(m)) => Ok(m.keys().map(|k| Val::Str(k.clone())).collect()),
        other => Err(format!("{what}() applies to lists and maps, not {other}")),
    }
}

fn as_bool(v: Result<Val, String>, op: &str) -> Result<bool, String> {
    match v? {
        Val::Bool(b) => Ok(b),
        other => Err(format!("{op} applies to bools, not {other}")),
    }
}

pub fn eval(e: &Expr, env: &mut Bindings) -> Result<Val, String> {
    Ok(match e {
        Expr::Var(name) => lookup(env, name)?,
        Expr::Int(n) => Val::Int(*n),
        Expr::Str(s) => Val::Str(s.clone()),
        Expr::Bool(b) => Val::Bool(*b),
        Expr::Null => Val::Null,
        Expr::List(items) => {
            let mut out = Vec::with_capacity(items.len());
            for i in items {
                out.push(to_json(eval(i, env)?));
            }
            Val::Json(Value::Array(out))
        }
        Expr::Field(obj, name) => match eval(obj, env)? {
            Val::Json(Value::Object(m)) => match m.get(name) {
                Some(v) => from_json(v),
                None => return Err(format!("no such key: {name}")),
            },
            other => return Err(format!("no such key: {name} (on {other})")),
        },
        Expr::Index(obj, index) => match (eval(obj, env)?, eval(index, env)?) {
            (Val::Json(Value::Object(m)), Val::Str(k)) => match m.get(&k) {
                Some(v) => from_json(v),
                None => return Err(format!("no such key: {k}")),
            },
            (Val::Json(Value::Array(items)), Val::Int(i)) => {
                match usize::try_from(i).ok().and_then(|i| items.get(i)) {
                    Some(v) => from_json(v),
                    None => return Err(format!("index out of bounds: {i}")),
                }
            }
            (o, i) => return Err(format!("no such overload: {o}[{i}]")),
        },
        Expr::Has(inner) => {
            let Expr::Field(obj, name) = inner.as_ref() else {
                return Err("has() takes a field selection".into());
            };
            match eval(obj, env)? {
                Val::Json(Value::Object(m)) => Val::Bool(m.contains_key(name)),
                _ => Val::Bool(false),
            }
        }
        Expr::Call(target, Method::Size, _) => match eval(target, env)? {
            // CEL strings count code points.
            Val::Str(s) => Val::Int(s.chars().count() as i64),
            Val::Json(Value::Array(a)) => Val::Int(a.len() as i64),
            Val::Json(Value::Object(m)) => Val::Int(m.len() as i64),
            other => return Err(format!("no such overload: size({other})")),
        },
        Expr::Call(target, method, args) => {
            let Val::Str(s) = eval(target, env)? else {
                return Err(format!("{method:?} applies to strings"));
            };
            let mut arg = |i: usize| -> Result<String, String> {
                match eval(&args[i], env)? {
                    Val::Str(a) => Ok(a),
                    other => Err(format!("expected a string argument, got {other}")),
                }
            };
            match method {
                Method::Size => unreachable!("handled above"),
                Method::Trim => Val::Str(s.trim().to_string()),
                Method::Contains => Val::Bool(s.contains(arg(0)?.as_str())),
                Method::StartsWith => Val::Bool(s.starts_with(arg(0)?.as_str())),
                Method::EndsWith => Val::Bool(s.ends_with(arg(0)?.as_str())),
                Method::Matches => {
                    let re = crate::regex::Regex::new(&arg(0)?)?;
                    Val::Bool(re.is_match(&s))
                }
            }
        }
        Expr::Macro(target, q, var, body) => {
            let name = match q {
                Quantifier::All => "all",
                Quantifier::Exists => "exists",
                Quantifier::ExistsOne => "exists_one",
            };
            let items = range(eval(target, env)?, name)?;
            // As CEL's comprehensions: a decisive result wins over an error elsewhere.
            let (mut trues, mut falses, mut error) = (0, 0, None);
            for item in items {
                env.push((var.clone(), item));
                let verdict = as_bool(eval(body, env), name);
                env.pop();
                match verdict {
                    Ok(true) => trues += 1,
                    Ok(false) => falses += 1,
                    Err(e) => error = error.or(Some(e)),
                }
            }
            match (q, error) {
                (Quantifier::All, _) if falses > 0 => Val::Bool(false),
                (Quantifier::Exists, _) if trues > 0 => Val::Bool(true),
                (_, Some(e)) => return Err(e),
                (Quantifier::All, None) => Val::Bool(true),
                (Quantifier::Exists, None) => Val::Bool(false),
                (Quantifier::ExistsOne, None) => Val::Bool(trues == 1),
            }
        }
        Expr::Not(inner) => Val::Bool(!as_bool(eval(inner, env), "!")?),
        // CEL's logical operators are commutative over errors: `error && false` is false.
        Expr::And(a, b) => match as_bool(eval(a, env), "&&") {
            Ok(false) => Val::Bool(false),
            Ok(true) => Val::Bool(as_bool(eval(b, env), "&&")?),
            Err(e) => match as_bool(eval(b, env), "&&") {
                Ok(false) => Val::Bool(false),
                _ => return Err(e),
            },
        },
        Expr::Or(a, b) => match as_bool(eval(a, env), "||") {
            Ok(true) => Val::Bool(true),
            Ok(false) => Val::Bool(as_bool(eval(b, env), "||")?),
            Err(e) => match as_bool(eval(b, env), "||") {
                Ok(true) => Val::Bool(true),
                _ => return Err(e),
            },
        },
        Expr::Cmp(a, op, b) => {
            let (a, b) = (eval(a, env)?, eval(b, env)?);
            match op {
                Op::Eq => return Ok(Val::Bool(equal(&a, &b))),
                Op::Ne => return Ok(Val::Bool(!equal(&a, &b))),
                _ => {}
            }
            let ord = match (&a, &b) {
                (Val::Int(x), Val::Int(y)) => x.cmp(y),
                (Val::Str(x), Val::Str(y)) => x.cmp(y),
                (Val::Bool(x), Val::Bool(y)) => x.cmp(y),
                _ => return Err(format!("no such overload: {a} {op:?} {b}")),
            };
            use std::cmp::Ordering::*;
            Val::Bool(match op {
                Op::Lt => ord == Less,
                Op::Le => ord != Greater,
                Op::Gt => ord == Greater,
                Op::Ge => ord != Less,
                Op::Eq | Op::Ne => unreachable!("answered above"),
            })
        }
        Expr::In(item, collection) => {
            let item = eval(item, env)?;
            match eval(collection, env)? {
                Val::Json(Value::Array(items)) => {
                    Val::Bool(items.iter().any(|i| equal(&item, &from_json(i))))
                }
                Val::Json(Value::Object(m)) => match &item {
                    Val::Str(k) => Val::Bool(m.contains_key(k)),
                    other => return Err(format!("no such overload: {other} in map")),
                },
                other => return Err(format!("no such overload: in {other}")),
            }
        }
    })
}

/// Whether `rule` holds with `self` bound to `this`. A rule that cannot be evaluated (a field
/// missing without `has()`) does not hold, as on a real server, where it is a validation error
/// too.
pub fn holds(rule: &Expr, this: &Value) -> Result<bool, String> {
    let mut env = vec![("self".to_string(), from_json(this))];
    match eval(rule, &mut env)? {
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
    // v1.28's validator moves the node's path down by each failing rule's fieldPath in turn,
    // so a later failing rule reports at the paths run together (fixture 46).
    let mut field = field.to_string();
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
                    &field,
                    &type_,
                    &format!("{e} evaluating rule: {rule}"),
                ));
                continue;
            }
        };
        let at = match r["fieldPath"].as_str().and_then(|p| field_path(schema, p)) {
            Some(sub) if field == "<nil>" => sub,
            Some(sub) => format!("{field}.{sub}"),
            None => field.clone(),
        };
        field.clone_from(&at);
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
        assert_eq!(
            check(
                "self.s.matches('^[a-z]+:[0-9]+$')",
                json!({"s": "nginx:127"})
            ),
            Ok(true)
        );
        assert_eq!(
            check("self.s.matches('^[a-z]+$')", json!({"s": "Nginx"})),
            Ok(false)
        );
        // CEL counts characters, not bytes.
        assert_eq!(check("self.s.size() == 2", json!({"s": "äö"})), Ok(true));
    }

    #[test]
    fn a_crd_whose_rule_the_test_server_cannot_evaluate_is_refused_not_skipped() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
            "x-kubernetes-validations": [{"rule": "self.image.lowerAscii() == 'x'"}]}}});
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

    fn eval_with(src: &str, vars: Vec<(&str, Value)>) -> Result<Val, String> {
        let names: Vec<&str> = vars.iter().map(|(n, _)| *n).collect();
        let e = parse_with(src, &names)?;
        let mut env = vars
            .into_iter()
            .map(|(n, v)| (n.to_string(), from_json(&v)))
            .collect();
        eval(&e, &mut env)
    }

    #[test]
    fn policy_expressions_see_object_old_object_and_request() {
        let pod = json!({"metadata": {"name": "p", "labels": {"app.kubernetes.io/managed-by": "op"}},
            "spec": {"containers": [
                {"name": "a", "resources": {"limits": {"cpu": "1"}}},
                {"name": "b", "resources": {}}]}});
        let vars = |op: &str| {
            vec![
                ("object", pod.clone()),
                ("oldObject", Value::Null),
                (
                    "request",
                    json!({"operation": op, "userInfo": {"username": "op"}}),
                ),
            ]
        };
        let check = |src: &str, op: &str| eval_with(src, vars(op));
        let limits = "object.spec.containers.all(c, has(c.resources.limits))";
        assert_eq!(check(limits, "CREATE"), Ok(Val::Bool(false)));
        assert_eq!(
            check(
                "object.spec.containers.exists(c, has(c.resources.limits))",
                "CREATE"
            ),
            Ok(Val::Bool(true))
        );
        assert_eq!(
            check(
                "object.spec.containers.exists_one(c, c.name.startsWith('a'))",
                "CREATE"
            ),
            Ok(Val::Bool(true))
        );
        assert_eq!(
            check(
                "oldObject == null && request.operation in ['CREATE', 'UPDATE']",
                "CREATE"
            ),
            Ok(Val::Bool(true))
        );
        assert_eq!(
            check("request.operation != 'DELETE' || false", "DELETE"),
            Ok(Val::Bool(false))
        );
        assert_eq!(
            check(
                "object.metadata.labels['app.kubernetes.io/managed-by'] == 'op'",
                "CREATE"
            ),
            Ok(Val::Bool(true))
        );
        assert_eq!(
            check(
                "'app.kubernetes.io/managed-by' in object.metadata.labels",
                "CREATE"
            ),
            Ok(Val::Bool(true))
        );
        assert_eq!(
            check(
                "size(object.spec.containers) == 2 && object.spec.containers[1].name == 'b'",
                "CREATE"
            ),
            Ok(Val::Bool(true))
        );
        assert_eq!(
            check("object.metadata.labels.size() > -1", "CREATE"),
            Ok(Val::Bool(true))
        );
        // Equality across types is false, not an error; ordering across types is an error.
        assert_eq!(
            check("object.metadata.name == 1", "CREATE"),
            Ok(Val::Bool(false))
        );
        assert!(check("object.metadata.name < 1", "CREATE").is_err());
        // A missing field is an error, unless the other side of && or || decides.
        assert!(check("oldObject.metadata.name == 'p'", "CREATE").is_err());
        assert_eq!(
            check("oldObject.metadata.name == 'p' && false", "CREATE"),
            Ok(Val::Bool(false))
        );
        assert_eq!(
            check(
                "object.spec.containers.all(c, c.resources.limits.cpu == '2')",
                "CREATE"
            ),
            Ok(Val::Bool(false)),
            "a false item decides over an error in another"
        );
        assert!(check(
            "object.spec.containers.all(c, c.resources.limits.cpu == '1')",
            "CREATE"
        )
        .is_err());
        assert_eq!(
            check(
                "object.spec.containers.exists(c, c.resources.limits.cpu == '1')",
                "CREATE"
            ),
            Ok(Val::Bool(true))
        );
    }

    #[test]
    fn only_declared_variables_and_those_of_macros_may_be_named() {
        assert!(parse_with("object.x == 1", &["object"]).is_ok());
        let e = parse_with("params.x == 1", &["object"]).unwrap_err();
        assert_eq!(e, "undeclared reference to 'params'");
        assert!(parse_with("object.items.all(i, i.x > 0)", &["object"]).is_ok());
        assert!(parse_with("object.items.all(i, i.x > 0) && i.y", &["object"]).is_err());
        assert!(
            parse("oldSelf == self").is_err(),
            "transition rules are not evaluated"
        );
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
                // Where the failing rule before it moved the path (as v1.28 does: fixture 46).
                (
                    "FieldValueInvalid",
                    "metadata.name",
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
        let e = parse("self.image.lowerAscii() == 'x'").unwrap_err();
        assert!(e.contains("lowerAscii"), "{e}");
        // matches() is evaluated, with a literal pattern the matcher supports.
        assert!(parse("self.image.matches('^x$')").is_ok());
        assert!(parse("self.image.matches('(?i)x')").is_err());
        assert!(parse("self.image.matches(self.pattern)").is_err());
        assert!(parse("self.x + 1 > 2").is_err());
        assert!(parse("self.x ? 1 : 2").is_err());
    }
}
