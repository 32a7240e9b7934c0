//! A small backtracking regular expression matcher for the RE2 syntax CRD schemas use in
//! `pattern` and CEL's `matches()`: literals, `.`, classes (ranges, `\d\w\s`, `[:xdigit:]`...),
//! groups, alternation, `* + ? {n,m}`, `^ $`. Unanchored search, as Go's `MatchString`.

use std::cell::Cell;

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Char(char),
    /// Any character but a newline.
    Any,
    /// Inclusive ranges; `negated` matches what none of them hold.
    Class(Vec<(char, char)>, bool),
    Start,
    End,
    Concat(Vec<Node>),
    Alt(Vec<Node>),
    Repeat(Box<Node>, u32, Option<u32>),
}

/// A compiled pattern.
#[derive(Debug, Clone, PartialEq)]
pub struct Regex {
    root: Node,
}

/// A backtracking bound: a pattern that needs more steps than this on one input is taken as
/// not matching (the inputs here are short: names, images, quantities).
const STEP_BUDGET: u32 = 1_000_000;

impl Regex {
    /// Compiles `pattern`, or says what in it this matcher does not support.
    pub fn new(pattern: &str) -> Result<Regex, String> {
        let chars: Vec<char> = pattern.chars().collect();
        let mut p = Parser { s: &chars, i: 0 };
        let root = p.alt()?;
        if p.i < chars.len() {
            return Err(format!("unexpected {:?} at {}", chars[p.i], p.i));
        }
        Ok(Regex { root })
    }

    /// Whether `text` has a match anywhere (anchors bind it to the ends).
    pub fn is_match(&self, text: &str) -> bool {
        let s: Vec<char> = text.chars().collect();
        let steps = Cell::new(0);
        let m = Matcher {
            s: &s,
            steps: &steps,
        };
        (0..=s.len()).any(|start| m.node(&self.root, start, &|_| true))
    }
}

struct Parser<'a> {
    s: &'a [char],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.s.get(self.i).copied()
    }

    fn alt(&mut self) -> Result<Node, String> {
        let mut branches = vec![self.concat()?];
        while self.peek() == Some('|') {
            self.i += 1;
            branches.push(self.concat()?);
        }
        Ok(if branches.len() == 1 {
            branches.pop().unwrap_or(Node::Concat(Vec::new()))
        } else {
            Node::Alt(branches)
        })
    }

    fn concat(&mut self) -> Result<Node, String> {
        let mut items = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' {
                break;
            }
            let atom = self.atom()?;
            items.push(self.quantified(atom)?);
        }
        Ok(Node::Concat(items))
    }

    /// A number of a `{n,m}` repeat, if digits follow.
    fn number(&mut self) -> Option<u32> {
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        self.s[start..self.i]
            .iter()
            .collect::<String>()
            .parse()
            .ok()
    }

    fn quantified(&mut self, mut atom: Node) -> Result<Node, String> {
        loop {
            let (min, max) = match self.peek() {
                Some('*') => (0, None),
                Some('+') => (1, None),
                Some('?') => (0, Some(1)),
                Some('{') => {
                    let save = self.i;
                    self.i += 1;
                    let Some(min) = self.number() else {
                        // Not a repeat: `{` is a literal, as in Go.
                        self.i = save;
                        return Ok(atom);
                    };
                    let max = if self.peek() == Some(',') {
                        self.i += 1;
                        self.number()
                    } else {
                        Some(min)
                    };
                    if self.peek() != Some('}') {
                        self.i = save;
                        return Ok(atom);
                    }
                    (min, max)
                }
                _ => return Ok(atom),
            };
            self.i += 1;
            // A lazy repeat matches the same strings; only where the match ends differs.
            if self.peek() == Some('?') {
                self.i += 1;
            }
            atom = Node::Repeat(Box::new(atom), min, max);
        }
    }

    fn atom(&mut self) -> Result<Node, String> {
        let c = self.peek().ok_or("unexpected end")?;
        self.i += 1;
        Ok(match c {
            '.' => Node::Any,
            '^' => Node::Start,
            '$' => Node::End,
            '(' => {
                if self.peek() == Some('?') {
                    if self.s.get(self.i + 1) == Some(&':') {
                        self.i += 2;
                    } else {
                        return Err("group flags and named groups are not supported".into());
                    }
                }
                let inner = self.alt()?;
                if self.peek() != Some(')') {
                    return Err("missing )".into());
                }
                self.i += 1;
                inner
            }
            '[' => self.class()?,
            '\\' => self.escape(false)?,
            '*' | '+' | '?' => return Err(format!("missing argument to repetition operator {c}")),
            other => Node::Char(other),
        })
    }

    /// After a backslash: a class shorthand or an escaped character.
    fn escape(&mut self, in_class: bool) -> Result<Node, String> {
        let c = self.peek().ok_or("trailing backslash")?;
        self.i += 1;
        let class = |ranges: Vec<(char, char)>, negated| Node::Class(ranges, negated);
        Ok(match c {
            'd' => class(digit(), false),
            'D' => class(digit(), true),
            'w' => class(word(), false),
            'W' => class(word(), true),
            's' => class(space(), false),
            'S' => class(space(), true),
            'n' => Node::Char('\n'),
            't' => Node::Char('\t'),
            'A' if !in_class => Node::Start,
            'z' if !in_class => Node::End,
            c if c.is_ascii_punctuation() => Node::Char(c),
            other => return Err(format!("unsupported escape \\{other}")),
        })
    }

    fn class(&mut self) -> Result<Node, String> {
        let negated = self.peek() == Some('^');
        if negated {
            self.i += 1;
        }
        let mut ranges = Vec::new();
        let mut first = true;
        loop {
            let c = self.peek().ok_or("missing ]")?;
            if c == ']' && !first {
                self.i += 1;
                break;
            }
            first = false;
            if c == '[' && self.s.get(self.i + 1) == Some(&':') {
                let end = (self.i..self.s.len().saturating_sub(1))
                    .find(|j| self.s[*j] == ':' && self.s[*j + 1] == ']' && *j > self.i + 1)
                    .ok_or("missing :]")?;
                let name: String = self.s[self.i + 2..end].iter().collect();
                ranges.extend(posix(&name)?);
                self.i = end + 2;
                continue;
            }
            self.i += 1;
            let lo = if c == '\\' {
                match self.escape(true)? {
                    Node::Char(ch) => ch,
                    Node::Class(rs, false) => {
                        ranges.extend(rs);
                        continue;
                    }
                    _ => return Err("negated shorthand inside a class is not supported".into()),
                }
            } else {
                c
            };
            if self.peek() == Some('-') && self.s.get(self.i + 1).is_some_and(|n| *n != ']') {
                self.i += 1;
                let mut hi = self.peek().ok_or("missing ]")?;
                self.i += 1;
                if hi == '\\' {
                    hi = match self.escape(true)? {
                        Node::Char(ch) => ch,
                        _ => return Err("a class shorthand cannot end a range".into()),
                    };
                }
                if hi < lo {
                    return Err(format!("invalid character class range {lo}-{hi}"));
                }
                ranges.push((lo, hi));
            } else {
                ranges.push((lo, lo));
            }
        }
        Ok(Node::Class(ranges, negated))
    }
}

fn digit() -> Vec<(char, char)> {
    vec![('0', '9')]
}

fn word() -> Vec<(char, char)> {
    vec![('0', '9'), ('A', 'Z'), ('_', '_'), ('a', 'z')]
}

fn space() -> Vec<(char, char)> {
    vec![('\t', '\n'), ('\x0c', '\r'), (' ', ' ')]
}

/// The ASCII classes of `[[:name:]]`.
fn posix(name: &str) -> Result<Vec<(char, char)>, String> {
    Ok(match name {
        "alpha" => vec![('A', 'Z'), ('a', 'z')],
        "digit" => digit(),
        "alnum" => vec![('0', '9'), ('A', 'Z'), ('a', 'z')],
        "xdigit" => vec![('0', '9'), ('A', 'F'), ('a', 'f')],
        "lower" => vec![('a', 'z')],
        "upper" => vec![('A', 'Z')],
        "space" => vec![('\t', '\r'), (' ', ' ')],
        "word" => word(),
        "punct" => vec![('!', '/'), (':', '@'), ('[', '`'), ('{', '~')],
        other => return Err(format!("unsupported class [:{other}:]")),
    })
}

struct Matcher<'a> {
    s: &'a [char],
    steps: &'a Cell<u32>,
}

impl Matcher<'_> {
    /// Whether `node` matches at `i` with the rest of the pattern (`k`) matching after it.
    fn node(&self, node: &Node, i: usize, k: &dyn Fn(usize) -> bool) -> bool {
        self.steps.set(self.steps.get() + 1);
        if self.steps.get() > STEP_BUDGET {
            return false;
        }
        let one = |ok: bool| ok && k(i + 1);
        match node {
            Node::Char(c) => one(self.s.get(i) == Some(c)),
            Node::Any => one(self.s.get(i).is_some_and(|c| *c != '\n')),
            Node::Class(ranges, negated) => one(self
                .s
                .get(i)
                .is_some_and(|c| ranges.iter().any(|(lo, hi)| (lo..=hi).contains(&c)) != *negated)),
            Node::Start => i == 0 && k(i),
            Node::End => i == self.s.len() && k(i),
            Node::Concat(items) => self.concat(items, i, k),
            Node::Alt(branches) => branches.iter().any(|b| self.node(b, i, k)),
            Node::Repeat(inner, min, max) => self.repeat(inner, *min, *max, 0, i, k),
        }
    }

    fn concat(&self, items: &[Node], i: usize, k: &dyn Fn(usize) -> bool) -> bool {
        match items.split_first() {
            None => k(i),
            Some((first, rest)) => self.node(first, i, &|j| self.concat(rest, j, k)),
        }
    }

    /// Greedy: one more iteration first, then the rest; an iteration that matches nothing
    /// ends the loop (so `(a*)*` terminates).
    fn repeat(
        &self,
        inner: &Node,
        min: u32,
        max: Option<u32>,
        count: u32,
        i: usize,
        k: &dyn Fn(usize) -> bool,
    ) -> bool {
        if max.is_none_or(|m| count < m)
            && self.node(inner, i, &|j| {
                (j != i || count < min) && self.repeat(inner, min, max, count + 1, j, k)
            })
        {
            return true;
        }
        count >= min && k(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, s: &str) -> bool {
        Regex::new(p).expect("compiles").is_match(s)
    }

    #[test]
    fn the_quantity_pattern_of_generated_crds() {
        let q = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";
        for ok in ["1", "500m", "1.5Gi", "128Mi", "1e3", "-2", ".5"] {
            assert!(m(q, ok), "{ok}");
        }
        for bad in ["lots", "1Gb", "", "1 Gi", "Mi"] {
            assert!(!m(q, bad), "{bad}");
        }
    }

    #[test]
    fn the_docker_reference_grammar() {
        let r = r"^((?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|[-]*)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|[-]*)[a-z0-9]+)*)*)(?::([\w][\w.-]{0,127}))?(?:@([A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*[:][[:xdigit:]]{32,}))?$";
        let digest = format!("x@sha256:{}", "a1".repeat(32));
        for ok in [
            "nginx",
            "nginx:1.27",
            "registry:5000/a/b:tag",
            digest.as_str(),
        ] {
            assert!(m(r, ok), "{ok}");
        }
        for bad in ["NGINX:::Latest@@", "nginx:", "a//b", "-x"] {
            assert!(!m(r, bad), "{bad}");
        }
    }

    #[test]
    fn search_is_unanchored_and_classes_alternation_and_counts_work() {
        assert!(m("b+", "abbbc"));
        assert!(!m("^b", "ab"));
        assert!(m("^(ab|cd){2}$", "abcd"));
        assert!(!m("^(ab|cd){3}$", "abcd"));
        assert!(m(r"^[^\s]+$", "no-space"));
        assert!(!m(r"^[^\s]+$", "a space"));
        assert!(m("^a{2,}$", "aaaa"));
        assert!(m("x{", "x{"));
        assert!(m("^(a*)*$", "aaa"));
        assert!(Regex::new("(?i)a").is_err());
        assert!(Regex::new("[z-a]").is_err());
        assert!(Regex::new("*a").is_err());
    }
}
