//! The Dockerfile subset `siesta template build -f` reads.
//!
//! Supported: `FROM` (a template name, an OCI image, or `e2bdev/base` for `base`; one
//! stage), `RUN`, `ENV`, `ARG`, `WORKDIR`, `USER`, `COPY`/`ADD` of local
//! files (`--chown`, `--chmod`), `CMD`/`ENTRYPOINT` (the start command).
//! `EXPOSE`, `LABEL`, `MAINTAINER` and `STOPSIGNAL` are accepted and have
//! no effect. Anything else is an error naming its line.
//!
//! Parsing is pure: COPY sources stay paths relative to the context; the
//! caller archives them (see the CLI's `build_context`).

use std::collections::BTreeMap;

/// A COPY as written: sources relative to the context, destination, and
/// its `--chown`/`--chmod`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopySpec {
    pub line: usize,
    pub sources: Vec<String>,
    pub dest: String,
    pub owner: Option<String>,
    pub mode: Option<u32>,
}

/// One instruction that becomes a build step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Instruction {
    Run(String),
    Env(Vec<(String, String)>),
    Workdir(String),
    User(String),
    Copy(CopySpec),
}

/// What a Dockerfile asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dockerfile {
    /// The `FROM` reference as written.
    pub from: String,
    pub instructions: Vec<Instruction>,
    pub start_cmd: Option<String>,
}

/// A parse error: the line (from 1) and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

/// Parses `text`; `build_args` override the defaults of `ARG`s.
pub fn parse(text: &str, build_args: &BTreeMap<String, String>) -> Result<Dockerfile, ParseError> {
    let mut p = Parser {
        args: BTreeMap::new(),
        build_args,
        from: None,
        instructions: Vec::new(),
        entrypoint: None,
        cmd: None,
    };
    for (line, body) in logical_lines(text) {
        p.instruction(line, &body)
            .map_err(|message| ParseError { line, message })?;
    }
    let from = p.from.ok_or(ParseError {
        line: 1,
        message: "no FROM: the first instruction must name the template to start from".into(),
    })?;
    let start_cmd = match (p.entrypoint, p.cmd) {
        (Some(e), Some(c)) => Some(format!("{e} {c}")),
        (e, c) => e.or(c),
    };
    Ok(Dockerfile {
        from,
        instructions: p.instructions,
        start_cmd,
    })
}

/// Joins continuation lines (`\` at the end) and drops comments and blank
/// lines; each item is the number of its first line and its text.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim();
        if current.is_none() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if current.is_some() && trimmed.starts_with('#') {
            continue; // comments inside a continued instruction
        }
        let (start, mut acc) = current.take().unwrap_or((i + 1, String::new()));
        let (piece, continues) = match trimmed.strip_suffix('\\') {
            Some(p) => (p, true),
            None => (trimmed, false),
        };
        if !acc.is_empty() {
            acc.push(' ');
        }
        acc.push_str(piece.trim_end());
        if continues {
            current = Some((start, acc));
        } else {
            out.push((start, acc));
        }
    }
    if let Some(last) = current {
        out.push(last);
    }
    out
}

struct Parser<'a> {
    args: BTreeMap<String, String>,
    build_args: &'a BTreeMap<String, String>,
    from: Option<String>,
    instructions: Vec<Instruction>,
    entrypoint: Option<String>,
    cmd: Option<String>,
}

impl Parser<'_> {
    fn instruction(&mut self, line: usize, body: &str) -> Result<(), String> {
        let (keyword, rest) = body.split_once(char::is_whitespace).unwrap_or((body, ""));
        let keyword = keyword.to_ascii_uppercase();
        let rest = rest.trim();
        if self.from.is_none() && !matches!(keyword.as_str(), "FROM" | "ARG") {
            return Err(format!("{keyword} before FROM"));
        }
        match keyword.as_str() {
            "FROM" => self.from_(rest, line),
            "ARG" => self.arg(rest),
            "RUN" => {
                let cmd = self.with_args(&shell_or_exec(rest)?);
                self.instructions.push(Instruction::Run(cmd));
                Ok(())
            }
            "ENV" => {
                let pairs = env_pairs(&self.expand(rest))?;
                self.instructions.push(Instruction::Env(pairs));
                Ok(())
            }
            "WORKDIR" => self.push_word(rest, Instruction::Workdir),
            "USER" => self.push_word(rest, Instruction::User),
            "COPY" | "ADD" => self.copy(line, &keyword, rest),
            "CMD" => {
                self.cmd = Some(shell_or_exec(rest)?);
                Ok(())
            }
            "ENTRYPOINT" => {
                self.entrypoint = Some(shell_or_exec(rest)?);
                Ok(())
            }
            "EXPOSE" | "LABEL" | "MAINTAINER" | "STOPSIGNAL" => Ok(()),
            other => Err(format!(
                "{other} is not supported (supported: FROM, RUN, ENV, ARG, WORKDIR, USER, COPY, ADD, CMD, ENTRYPOINT; EXPOSE, LABEL, MAINTAINER, STOPSIGNAL are ignored)"
            )),
        }
    }

    fn from_(&mut self, rest: &str, _line: usize) -> Result<(), String> {
        if self.from.is_some() {
            return Err("a second FROM: multi-stage builds are not supported".into());
        }
        let mut words = rest.split_whitespace().filter(|w| !w.starts_with("--"));
        let image = words.next().ok_or("FROM needs a template or image")?;
        self.from = Some(self.expand(image));
        Ok(())
    }

    fn arg(&mut self, rest: &str) -> Result<(), String> {
        let (name, default) = match rest.split_once('=') {
            Some((n, d)) => (n.trim(), Some(unquote(d.trim()))),
            None => (rest.trim(), None),
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("bad ARG name {name:?}"));
        }
        let value = self
            .build_args
            .get(name)
            .cloned()
            .or(default)
            .unwrap_or_default();
        self.args.insert(name.to_string(), value);
        Ok(())
    }

    fn push_word(&mut self, rest: &str, make: fn(String) -> Instruction) -> Result<(), String> {
        let word = self.expand(&unquote(rest));
        if word.is_empty() {
            return Err("needs a value".into());
        }
        self.instructions.push(make(word));
        Ok(())
    }

    fn copy(&mut self, line: usize, keyword: &str, rest: &str) -> Result<(), String> {
        let mut owner = None;
        let mut mode = None;
        let mut paths = Vec::new();
        for word in split_words(rest)? {
            if let Some(v) = word.strip_prefix("--chown=") {
                owner = Some(self.expand(v));
            } else if let Some(v) = word.strip_prefix("--chmod=") {
                mode = Some(
                    u32::from_str_radix(v, 8).map_err(|_| format!("--chmod={v} is not octal"))?,
                );
            } else if word.starts_with("--") {
                return Err(format!(
                    "{keyword} {word} is not supported (only --chown and --chmod)"
                ));
            } else {
                paths.push(self.expand(&word));
            }
        }
        if paths.len() < 2 {
            return Err(format!(
                "{keyword} needs at least one source and a destination"
            ));
        }
        let dest = paths.pop().unwrap_or_default();
        if paths.iter().any(|s| s.contains("://")) {
            return Err(format!(
                "{keyword} from a URL is not supported: download it in a RUN step"
            ));
        }
        self.instructions.push(Instruction::Copy(CopySpec {
            line,
            sources: paths,
            dest,
            owner,
            mode,
        }));
        Ok(())
    }

    /// Substitutes `$NAME` and `${NAME}` of the ARGs seen so far.
    fn expand(&self, s: &str) -> String {
        let mut out = s.to_string();
        for (k, v) in &self.args {
            out = out
                .replace(&format!("${{{k}}}"), v)
                .replace(&format!("${k}"), v);
        }
        out
    }

    /// A RUN command with the ARGs in its environment, as Docker gives them.
    fn with_args(&self, cmd: &str) -> String {
        if self.args.is_empty() {
            return cmd.to_string();
        }
        let exports: Vec<String> = self
            .args
            .iter()
            .map(|(k, v)| format!("{k}='{}'", v.replace('\'', r"'\''")))
            .collect();
        format!("export {}; {cmd}", exports.join(" "))
    }
}

/// `["a", "b"]` (exec form) as a shell command line, or the text as it is.
fn shell_or_exec(rest: &str) -> Result<String, String> {
    if !rest.starts_with('[') {
        if rest.is_empty() {
            return Err("needs a command".into());
        }
        return Ok(rest.to_string());
    }
    let words: Vec<String> = serde_json::from_str(rest)
        .map_err(|e| format!("bad exec form (a JSON array of strings): {e}"))?;
    if words.is_empty() {
        return Err("an empty command".into());
    }
    Ok(words
        .iter()
        .map(|w| {
            if !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:@%+,".contains(c))
            {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" "))
}

/// `ENV a=1 b="two words"` or the legacy `ENV a one value`.
fn env_pairs(rest: &str) -> Result<Vec<(String, String)>, String> {
    let words = split_words(rest)?;
    if words.is_empty() {
        return Err("ENV needs a name and a value".into());
    }
    if !words[0].contains('=') {
        let (name, value) = rest
            .split_once(char::is_whitespace)
            .ok_or("ENV needs a value")?;
        return Ok(vec![(name.to_string(), unquote(value.trim()))]);
    }
    words
        .iter()
        .map(|w| {
            w.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| format!("ENV {w:?} is not name=value"))
        })
        .collect()
}

/// Splits on whitespace, keeping "double" and 'single' quoted parts
/// together (quotes removed).
fn split_words(s: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut in_word = false;
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return Err("an unterminated quote".into());
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    for q in ['"', '\''] {
        if s.len() >= 2 && s.starts_with(q) && s.ends_with(q) {
            return s[1..s.len() - 1].to_string();
        }
    }
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Dockerfile {
        parse(text, &BTreeMap::new()).expect("parses")
    }

    #[test]
    fn reads_the_supported_instructions() {
        let d = parsed(
            "# a comment\nARG VER=3\nFROM base\nENV A=1 B=\"two words\"\nENV LEGACY some value\n\
             RUN apt-get update && \\\n    echo $VER\nWORKDIR /app\nUSER user\n\
             COPY --chown=user:user --chmod=755 a.txt b/ /app/\nEXPOSE 8000\nCMD [\"python3\", \"-m\", \"http.server\"]\n",
        );
        assert_eq!(d.from, "base");
        assert_eq!(
            d.instructions,
            vec![
                Instruction::Env(vec![
                    ("A".into(), "1".into()),
                    ("B".into(), "two words".into())
                ]),
                Instruction::Env(vec![("LEGACY".into(), "some value".into())]),
                Instruction::Run("export VER='3'; apt-get update && echo $VER".into()),
                Instruction::Workdir("/app".into()),
                Instruction::User("user".into()),
                Instruction::Copy(CopySpec {
                    line: 10,
                    sources: vec!["a.txt".into(), "b/".into()],
                    dest: "/app/".into(),
                    owner: Some("user:user".into()),
                    mode: Some(0o755),
                }),
            ]
        );
        assert_eq!(d.start_cmd.as_deref(), Some("python3 -m http.server"));
    }

    #[test]
    fn build_args_override_defaults_and_expand() {
        let args = BTreeMap::from([("DIR".to_string(), "/srv".to_string())]);
        let d = parse("FROM base\nARG DIR=/opt\nWORKDIR ${DIR}/x\n", &args).unwrap();
        assert_eq!(d.instructions, vec![Instruction::Workdir("/srv/x".into())]);
    }

    #[test]
    fn entrypoint_and_cmd_combine() {
        let d = parsed("FROM base\nENTRYPOINT [\"node\"]\nCMD [\"server.js\"]\n");
        assert_eq!(d.start_cmd.as_deref(), Some("node server.js"));
    }

    #[test]
    fn unsupported_things_name_their_line() {
        let err = |t: &str| parse(t, &BTreeMap::new()).unwrap_err();
        let e = err("FROM base\nRUN true\nHEALTHCHECK CMD true\n");
        assert_eq!(e.line, 3);
        assert!(e.message.contains("HEALTHCHECK is not supported"), "{e}");
        assert_eq!(err("FROM a\nFROM b\n").line, 2);
        assert!(err("RUN x\n").message.contains("before FROM"));
        assert!(err("FROM base\nCOPY --from=x a b\n")
            .message
            .contains("--from"));
        assert!(err("FROM base\nADD https://x/y /y\n")
            .message
            .contains("URL"));
        assert!(err("FROM base\nCOPY onlyone\n")
            .message
            .contains("source and a destination"));
        assert_eq!(err("").message.split(':').next(), Some("no FROM"));
    }
}

/// Hostile input (issue 12): any text is a Dockerfile or a parse error
/// with a line number, never a panic.
#[cfg(test)]
mod hostile {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn any_text_never_panics(text in "\\PC{0,400}") {
            let _ = parse(&text, &BTreeMap::new());
        }

        #[test]
        fn instruction_shaped_lines_never_panic(
            lines in proptest::collection::vec(
                "(FROM|RUN|ENV|ARG|WORKDIR|USER|COPY|CMD|ENTRYPOINT|EXPOSE|LABEL|#) ?[-a-zA-Z0-9=:/\\[\\]\" \\\\$.{}]{0,40}",
                0..12,
            ),
        ) {
            let _ = parse(&lines.join("\n"), &BTreeMap::new());
        }
    }
}
