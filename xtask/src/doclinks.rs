//! `cargo xtask doclinks`, and the first phase of `cargo xtask test`: every relative link in
//! the repository's Markdown files names a file that exists and, with `#anchor`, a heading
//! (by GitHub's slug) or an `<a id>`/`<a name>` in it. Web links (`http:`, `https:`,
//! `mailto:` …) are not followed: this machine has no internet, and a check that depended
//! on other sites would fail for reasons outside the repository.
//!
//! The parsing is a deliberately small subset of CommonMark, enough for how this
//! repository writes Markdown: inline links and images, reference definitions, ATX and
//! setext headings, fenced code blocks and code spans (neither holds links nor headings).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::path::Path;
use std::process::Command;

use anyhow::Context as _;

/// Checks the documentation's links, and nothing else.
#[derive(clap::Args)]
pub(crate) struct Doclinks {}

impl Doclinks {
    pub(crate) fn run(&self) -> anyhow::Result<()> {
        run(&ckpt_e2e::project_root())
    }
}

/// Reads the repository's Markdown files and fails naming every link that does not resolve.
pub(crate) fn run(root: &Path) -> anyhow::Result<()> {
    let files = repository_files(root)?;
    let mut docs = BTreeMap::new();
    for path in files.iter().filter(|p| is_checked_doc(p)) {
        let text = std::fs::read_to_string(root.join(path)).with_context(|| format!("reading {path}"))?;
        docs.insert(path.clone(), text);
    }
    let broken = check_all(&docs, &files);
    for b in &broken {
        eprintln!("{b}");
    }
    anyhow::ensure!(
        broken.is_empty(),
        "{} broken documentation link(s) in {} Markdown files",
        broken.len(),
        docs.len()
    );
    eprintln!(
        "xtask doclinks: every relative link of {} Markdown files resolves",
        docs.len()
    );
    Ok(())
}

/// The repository's files: tracked ones and new ones not ignored, so a page being written
/// can be linked before it is added (CI's clean clone has only the tracked ones, and so
/// catches a link to a file never added). Files deleted from the work tree are left out.
fn repository_files(root: &Path) -> anyhow::Result<BTreeSet<String>> {
    let out = Command::new("git")
        .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard"])
        .current_dir(root)
        .output()
        .context("running git ls-files")?;
    anyhow::ensure!(
        out.status.success(),
        "git ls-files failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let list = String::from_utf8(out.stdout).context("git ls-files printed a path that is not UTF-8")?;
    Ok(list
        .split('\0')
        .filter(|p| !p.is_empty() && root.join(p).exists())
        .map(str::to_owned)
        .collect())
}

/// Markdown the repository writes: fuzz corpora and build output are data, not documents.
fn is_checked_doc(path: &str) -> bool {
    path.ends_with(".md")
        && !path.starts_with("fuzz/corpus/")
        && !path.starts_with("target/")
        && !path.contains("/target/")
}

/// A link that does not resolve, where it is written.
#[derive(Debug, PartialEq, Eq)]
struct Broken {
    file: String,
    line: usize,
    target: String,
    why: String,
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: broken link `{}`: {}",
            self.file, self.line, self.target, self.why
        )
    }
}

/// Every broken link of `docs` (path → Markdown), checked against `files` (every path of
/// the repository, `docs`' own included), in file and line order.
fn check_all(docs: &BTreeMap<String, String>, files: &BTreeSet<String>) -> Vec<Broken> {
    let anchors: HashMap<&str, HashSet<String>> = docs
        .iter()
        .map(|(path, text)| (path.as_str(), anchors(text)))
        .collect();
    let mut broken = Vec::new();
    for (file, text) in docs {
        for link in links(text) {
            if let Err(why) = resolve_link(file, &link.target, files, &anchors) {
                broken.push(Broken {
                    file: file.clone(),
                    line: link.line,
                    target: link.target,
                    why,
                });
            }
        }
    }
    broken
}

/// `Ok` when `target`, written in `from`, names something that exists; else why not.
fn resolve_link(
    from: &str,
    target: &str,
    files: &BTreeSet<String>,
    anchors: &HashMap<&str, HashSet<String>>,
) -> Result<(), String> {
    if target.is_empty() {
        return Err("empty target".into());
    }
    if has_scheme(target) || target.starts_with("//") {
        return Ok(());
    }
    let (path, fragment) = match target.split_once('#') {
        Some((path, fragment)) => (path, Some(fragment)),
        None => (target, None),
    };
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    let resolved = if path.is_empty() {
        from.to_owned()
    } else {
        let decoded = percent_decode(path);
        let resolved = join(from, &decoded).ok_or("points outside the repository")?;
        if !exists(&resolved, files) {
            return Err(format!("no file or directory {resolved}"));
        }
        resolved
    };
    let Some(fragment) = fragment.filter(|f| !f.is_empty()) else {
        return Ok(());
    };
    // Fragments of other files (`main.rs#L10`) are the host's line anchors: not checked.
    if !resolved.ends_with(".md") {
        return Ok(());
    }
    let Some(known) = anchors.get(resolved.as_str()) else {
        return Err(format!("{resolved} is not among the checked Markdown files"));
    };
    if known.contains(&percent_decode(fragment)) {
        Ok(())
    } else {
        Err(format!(
            "no heading or <a id> with the anchor `{fragment}` in {resolved}"
        ))
    }
}

/// `https:`, `mailto:` and the like (RFC 3986's scheme, then a colon).
fn has_scheme(target: &str) -> bool {
    let Some((scheme, _)) = target.split_once(':') else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-'))
}

/// `target` relative to the directory of `from` (or to the root, with a leading `/`), with
/// `.` and `..` resolved; `None` when it climbs out of the repository.
fn join(from: &str, target: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    let relative = match target.strip_prefix('/') {
        Some(rooted) => rooted,
        None => {
            parts.extend(from.split('/'));
            parts.pop(); // the file's own name
            target
        }
    };
    for part in relative.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            _ => parts.push(part),
        }
    }
    Some(parts.join("/"))
}

/// A file of the repository, or a directory holding one (the root is `""`).
fn exists(path: &str, files: &BTreeSet<String>) -> bool {
    if path.is_empty() || files.contains(path) {
        return true;
    }
    let dir = format!("{path}/");
    files
        .range(dir.clone()..)
        .next()
        .is_some_and(|f| f.starts_with(&dir))
}

/// `%20` and the like as the characters they stand for (a malformed escape stays as is).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A link target as written, and its 1-based line.
#[derive(Debug, PartialEq, Eq)]
struct Link {
    line: usize,
    target: String,
}

/// The lines of `text` outside fenced code blocks, with their 1-based numbers (fences
/// themselves left out).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<(char, usize)> = None;
    let mut prose = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = trimmed.chars().next().filter(|c| matches!(c, '`' | '~'));
        let run = marker.map_or(0, |m| trimmed.chars().take_while(|&c| c == m).count());
        match (fence, marker) {
            (None, Some(m)) if run >= 3 => fence = Some((m, run)),
            (Some((m, n)), Some(c)) if c == m && run >= n && trimmed[run..].trim().is_empty() => fence = None,
            (None, _) => prose.push((i + 1, line)),
            (Some(_), _) => {}
        }
    }
    prose
}

/// `line` with its code spans blanked out (same length, so positions keep their meaning):
/// a link written inside backticks is an example, not a link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let after = &rest[start + ticks..];
        let closing = "`".repeat(ticks);
        // A closing run of exactly as many backticks ends the span; none leaves them literal.
        let end = after
            .match_indices(&closing)
            .map(|(i, _)| i)
            .find(|&i| !after[i + ticks..].starts_with('`') && (i == 0 || !after[..i].ends_with('`')));
        match end {
            Some(end) => {
                out.push_str(&" ".repeat(ticks + end + ticks));
                rest = &after[end + ticks..];
            }
            None => {
                out.push_str(&rest[start..start + ticks]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Every inline link or image target (`[text](target)`) and reference definition
/// (`[label]: target`) outside code.
fn links(text: &str) -> Vec<Link> {
    let mut found = Vec::new();
    for (line, raw) in prose_lines(text) {
        let prose = without_code_spans(raw);
        if let Some(target) = reference_definition(&prose) {
            found.push(Link { line, target });
            continue;
        }
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(target) = inline_target(rest) {
                found.push(Link { line, target });
            }
        }
    }
    found
}

/// The target of `[label]: target` (up to three spaces before it).
fn reference_definition(line: &str) -> Option<String> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let rest = line
        .trim_start_matches(' ')
        .strip_prefix('[')
        .filter(|_| indent <= 3)?;
    let (label, after) = rest.split_once("]:")?;
    if label.is_empty() || label.contains('[') || label.starts_with('^') {
        return None;
    }
    let target = after.split_whitespace().next()?;
    Some(target.trim_start_matches('<').trim_end_matches('>').to_owned())
}

/// The target at the start of `rest`, the text after `](`: `<…>`, or up to white space or
/// the `)` that closes the link (parentheses inside it balanced).
fn inline_target(rest: &str) -> Option<String> {
    let rest = rest.trim_start();
    if let Some(bracketed) = rest.strip_prefix('<') {
        return bracketed.split_once('>').map(|(t, _)| t.to_owned());
    }
    let mut depth = 0usize;
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => return Some(rest[..i].to_owned()),
            ')' => depth -= 1,
            c if c.is_whitespace() => return Some(rest[..i].to_owned()),
            _ => {}
        }
    }
    None
}

/// The anchors a link may name in `text`: each heading's GitHub slug (a repeated slug gets
/// `-1`, `-2` …) and every `<a id="…">` or `<a name="…">`.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = HashSet::new();
    let mut previous: Option<&str> = None;
    for (_, line) in prose_lines(text) {
        let heading = atx_heading(line).or_else(|| previous.filter(|_| is_setext_underline(line)));
        if let Some(heading) = heading {
            let slug = slug(heading);
            let n = seen.entry(slug.clone()).or_insert(0);
            anchors.insert(if *n == 0 { slug } else { format!("{slug}-{n}") });
            *n += 1;
        }
        anchors.extend(html_anchors(line));
        previous = paragraph_text(line).filter(|_| heading.is_none());
    }
    anchors
}

/// The text of an ATX heading (`## Title ##`), if `line` is one.
fn atx_heading(line: &str) -> Option<&str> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let rest = line.trim_start_matches(' ');
    let level = rest.chars().take_while(|&c| c == '#').count();
    if indent > 3 || !(1..=6).contains(&level) {
        return None;
    }
    let text = &rest[level..];
    if !text.is_empty() && !text.starts_with([' ', '\t']) {
        return None;
    }
    let text = text.trim();
    // A closing run of `#`s is not part of the text (when white space precedes it).
    let without_closing = text.trim_end_matches('#');
    Some(
        if without_closing.is_empty() || without_closing.ends_with([' ', '\t']) {
            without_closing.trim_end()
        } else {
            text
        },
    )
}

/// `===` or `---` under a paragraph line makes that line a heading.
fn is_setext_underline(line: &str) -> bool {
    let t = line.trim();
    !t.is_empty() && (t.chars().all(|c| c == '=') || t.chars().all(|c| c == '-'))
}

/// A line that may be a setext heading's text: plain paragraph text, not a list item, a
/// table row, a quote or a heading.
fn paragraph_text(line: &str) -> Option<&str> {
    let t = line.trim();
    let starts_block = t.starts_with(['-', '*', '+', '|', '>', '#', '<']) || t.is_empty();
    (!starts_block && !line.starts_with("    ")).then_some(t)
}

/// GitHub's heading anchor: the text as rendered (links by their text, without markup),
/// lower-cased, spaces as `-`, punctuation but `-` and `_` dropped.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // A link or image in a heading contributes its text only.
    while let Some(at) = rest.find("](") {
        let (before, after) = rest.split_at(at);
        text.push_str(before);
        let target_len = inline_target(&after[2..]).map_or(0, |t| t.len());
        rest = after[2 + target_len..]
            .strip_prefix(')')
            .unwrap_or(&after[2 + target_len..]);
    }
    text.push_str(rest);
    let mut slug = String::with_capacity(text.len());
    let mut in_tag = false;
    for c in text.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            _ if in_tag => {}
            ' ' => slug.push('-'),
            '-' | '_' => slug.push(c),
            c if c.is_alphanumeric() => slug.extend(c.to_lowercase()),
            _ => {}
        }
    }
    slug
}

/// The ids of `<a id="…">` and `<a name="…">` tags in `line`.
fn html_anchors(line: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("<a ") {
        let tag = &rest[at..];
        let tag = &tag[..tag.find('>').unwrap_or(tag.len())];
        for attribute in ["id=", "name="] {
            let Some(value) = tag.find(attribute).map(|i| &tag[i + attribute.len()..]) else {
                continue;
            };
            let quote = value.chars().next().filter(|c| matches!(c, '"' | '\''));
            if let Some(q) = quote
                && let Some((id, _)) = value[1..].split_once(q)
            {
                ids.push(id.to_owned());
            }
        }
        rest = &rest[at + 3..];
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks `files` (path, content; every path exists, those ending in `.md` are checked)
    /// and compares the broken links, each as `file:line target`.
    fn check(files: &[(&str, &str)], expected: &[&str]) {
        let paths: BTreeSet<String> = files.iter().map(|(p, _)| (*p).to_owned()).collect();
        let docs: BTreeMap<String, String> = files
            .iter()
            .filter(|(p, _)| is_checked_doc(p))
            .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
            .collect();
        let broken: Vec<String> = check_all(&docs, &paths)
            .iter()
            .map(|b| format!("{}:{} {}", b.file, b.line, b.target))
            .collect();
        assert_eq!(broken, expected, "{files:?}");
    }

    /// A case: what it shows, the files (path, content), the broken links expected.
    type Case = (
        &'static str,
        &'static [(&'static str, &'static str)],
        &'static [&'static str],
    );

    #[test]
    fn links_are_checked() {
        let cases: &[Case] = &[
            (
                "files and directories, relative to the linking file",
                &[
                    (
                        "README.md",
                        "[a](docs/a.md) [b](docs/b.md) [c](crates/x) [d](crates/y/)",
                    ),
                    (
                        "docs/a.md",
                        "[up](../README.md) [root](/Cargo.toml) [gone](../Cargo.lock)",
                    ),
                    ("crates/x/src/lib.rs", ""),
                    ("Cargo.toml", ""),
                ],
                &[
                    "README.md:1 docs/b.md",
                    "README.md:1 crates/y/",
                    "docs/a.md:1 ../Cargo.lock",
                ],
            ),
            (
                "anchors in the same file and in another one",
                &[
                    (
                        "README.md",
                        "# Title\n\n## `run` flags\n\n[f](#run-flags) [t](#title) [x](#nope)\n\
                         [m](docs/m.md#migrating-from-bootkubes-checkpointer) [n](docs/m.md#nope)",
                    ),
                    ("docs/m.md", "## Migrating from bootkube's checkpointer\n"),
                ],
                &["README.md:5 #nope", "README.md:6 docs/m.md#nope"],
            ),
            (
                "repeated headings are numbered; explicit anchors count",
                &[(
                    "a.md",
                    "## Notes\n## Notes\n## Notes\n<a id=\"Custom\"></a>\n<a name='old'></a>\n\
                     [1](#notes) [2](#notes-1) [3](#notes-2) [4](#notes-3) [5](#Custom) [6](#old)",
                )],
                &["a.md:6 #notes-3"],
            ),
            (
                "code blocks and code spans hold neither links nor headings",
                &[(
                    "a.md",
                    "```sh\n# not a heading\n[x](missing.md)\n```\n`[y](missing.md)` and ``a ` [z](missing.md)``\n\
                     ~~~\n## Hidden\n~~~\n[h](#hidden) [n](#not-a-heading)",
                )],
                &["a.md:9 #hidden", "a.md:9 #not-a-heading"],
            ),
            (
                "web links are not followed; line anchors of other files are not checked",
                &[
                    (
                        "a.md",
                        "[w](https://example.com/x.md#y) [m](mailto:a@b.c) [p](//host/x) [l](src/lib.rs#L10)",
                    ),
                    ("src/lib.rs", ""),
                ],
                &[],
            ),
            (
                "reference definitions, images, titles, angle brackets and parentheses",
                &[
                    (
                        "a.md",
                        "[ref]: b.md#top\n[bad]: <c.md>\n![img](pic.png \"a title\") [p](d_(1).md) [s](<e f.md>)\n\
                         [q](b.md?plain=1#top) [pct](e%20f.md)",
                    ),
                    ("b.md", "Top\n===\n"),
                    ("pic.png", ""),
                    ("d_(1).md", ""),
                    ("e f.md", ""),
                ],
                &["a.md:2 c.md"],
            ),
            (
                "a heading's slug: links by their text, punctuation dropped, closing hashes",
                &[(
                    "a.md",
                    "## See [the docs](x.md) now ##\n### A *strategy* of your own: 1.2-b_c!\n#No heading\n\
                     [1](#see-the-docs-now) [2](#a-strategy-of-your-own-12-b_c) [3](#no-heading)",
                )],
                &["a.md:1 x.md", "a.md:4 #no-heading"],
            ),
            (
                "a link that climbs out of the repository, an empty one, fuzz corpora unchecked",
                &[
                    ("docs/a.md", "[out](../../x.md) [empty]()"),
                    ("fuzz/corpus/config/seed.md", "[x](nowhere.md)"),
                ],
                &["docs/a.md:1 ../../x.md", "docs/a.md:1 "],
            ),
        ];
        for (name, files, expected) in cases {
            eprintln!("case: {name}");
            check(files, expected);
        }
    }
}
