//! How a file on disk is named as a Baton resource: one rule for every agent runtime (the
//! Claude Code hook, `baton mcp`, `baton name`), so that one file is always one name and two
//! repositories' `src/lib.rs` are two.
//!
//! The name is the file's **repository identity** followed by its path relative to the
//! repository's root, after symbolic links are resolved (a link claims its target):
//! `github.com/acme/web/src/auth.rs`.
//!
//! - The root is `--root` when the file lies under it, else the nearest directory at or above
//!   the file holding a `.git` entry (a git top level, worktrees included).
//! - The identity of a root is `--repo` when it is the configured root (`--root`, or when that
//!   is absent the git top level of the working directory); else the root's `origin` remote
//!   URL without scheme, user, port or `.git` (`git@github.com:acme/web.git` and
//!   `https://github.com/acme/web` are both `github.com/acme/web`); else the root's own
//!   absolute path without its leading `/`.
//! - A file under no root is named by its absolute path without the leading `/`.
//!
//! Nothing here talks to Baton, and nothing runs `git`: the rule reads the file system only,
//! so a hook that starts a process per edit stays cheap. What must never live here: claims.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

/// Longest git config file read for a root's `origin` URL.
const GIT_CONFIG_BYTES_MAX: u64 = 1 << 20;
/// Longest `.git` file (a worktree's or submodule's `gitdir:` pointer) or `commondir` read.
const GIT_POINTER_BYTES_MAX: u64 = 4096;

/// What a runtime was told about naming: `--root` and `--repo`, both optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileNaming {
    /// Treat this directory as a repository root (relative to the working directory).
    pub root: Option<PathBuf>,
    /// The identity of the configured root, instead of its `origin` remote.
    pub repo: Option<String>,
}

/// A file's resource name, with what it was derived from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileName {
    /// The resource name, e.g. `github.com/acme/web/src/auth.rs`.
    pub resource: String,
    /// The file's absolute path after symbolic links are resolved.
    pub file: PathBuf,
    /// The repository root it is named relative to, if any.
    pub root: Option<PathBuf>,
}

/// A file that cannot be named: the message says which part and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NameError(String);

/// The resource name of `path` (absolute, or relative to `working_directory`) under `naming`.
///
/// # Errors
///
/// [`NameError`] when a part of the name is not UTF-8 or holds a control character, when
/// `--repo` is not a valid name, or when the path is the file system's root.
pub fn name_file(
    path: &Path,
    working_directory: &Path,
    naming: &FileNaming,
) -> Result<FileName, NameError> {
    if let Some(repo) = &naming.repo {
        check_identity(repo).map_err(|why| NameError(format!("--repo {repo:?}: {why}")))?;
    }
    let file = resolve(&working_directory.join(path));
    let configured = match &naming.root {
        Some(root) => Some(resolve(&working_directory.join(root))),
        None => git_top_level(&resolve(working_directory)),
    };
    let root = match configured.as_deref() {
        Some(root) if file.starts_with(root) => Some(root.to_path_buf()),
        _ => git_top_level(&file),
    };
    let identity = match root.as_deref() {
        None => String::new(),
        Some(root) => match (&naming.repo, configured.as_deref() == Some(root)) {
            (Some(repo), true) => repo.trim_matches('/').to_owned(),
            _ => origin_identity(root).unwrap_or_else(|| path_identity(root)),
        },
    };
    let relative = file
        .strip_prefix(root.as_deref().unwrap_or(Path::new("/")))
        .unwrap_or(&file);
    let mut segments: Vec<&str> = identity.split('/').filter(|s| !s.is_empty()).collect();
    for component in relative.components() {
        let Component::Normal(part) = component else {
            continue;
        };
        let part = part.to_str().ok_or_else(|| {
            NameError(format!(
                "{} cannot be named: its path is not UTF-8",
                file.display()
            ))
        })?;
        segments.push(part);
    }
    if segments.is_empty() {
        return Err(NameError(
            "the file system's root cannot be named".to_owned(),
        ));
    }
    if let Some(bad) = segments
        .iter()
        .find(|segment| check_segment(segment).is_err())
    {
        return Err(NameError(format!(
            "{} cannot be named: its part {bad:?} holds a control character",
            file.display()
        )));
    }
    Ok(FileName {
        resource: segments.join("/"),
        file,
        root,
    })
}

/// `path` made absolute through its nearest existing ancestor's real path (symbolic links
/// resolved); the part that does not exist yet is kept with `.` and `..` applied by text.
fn resolve(path: &Path) -> PathBuf {
    for ancestor in path.ancestors() {
        let Ok(real) = ancestor.canonicalize() else {
            continue;
        };
        let rest = path.strip_prefix(ancestor).unwrap_or(Path::new(""));
        let mut resolved = real;
        for component in rest.components() {
            match component {
                Component::Normal(part) => resolved.push(part),
                Component::ParentDir => {
                    resolved.pop();
                }
                Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            }
        }
        return resolved;
    }
    path.to_path_buf()
}

/// The nearest directory at or above `path` with a `.git` entry (a directory, or the file a
/// worktree or submodule has).
fn git_top_level(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .find(|directory| directory.join(".git").exists())
        .map(Path::to_path_buf)
}

/// The identity from `root`'s `origin` remote, when it has one that makes a valid name.
fn origin_identity(root: &Path) -> Option<String> {
    let config = git_config(root)?;
    let url = origin_url(&read_bounded(&config, GIT_CONFIG_BYTES_MAX)?)?;
    let identity = remote_identity(&url)?;
    check_identity(&identity).ok()?;
    Some(identity)
}

/// The git config file of the repository whose top level is `root`.
fn git_config(root: &Path) -> Option<PathBuf> {
    let dot_git = root.join(".git");
    if dot_git.is_dir() {
        return Some(dot_git.join("config"));
    }
    // A worktree or submodule: `.git` is a file `gitdir: PATH`; a worktree's gitdir names
    // the repository's common dir, which holds the config, in `commondir`.
    let pointer = read_bounded(&dot_git, GIT_POINTER_BYTES_MAX)?;
    let git_dir = root.join(pointer.trim().strip_prefix("gitdir:")?.trim());
    let common = match read_bounded(&git_dir.join("commondir"), GIT_POINTER_BYTES_MAX) {
        Some(common) => git_dir.join(common.trim()),
        None => git_dir,
    };
    Some(common.join("config"))
}

fn read_bounded(path: &Path, bytes_max: u64) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(bytes_max)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// The `url` of `[remote "origin"]` in a git config file's text.
fn origin_url(config: &str) -> Option<String> {
    let mut in_origin = false;
    for line in config.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            let header: String = line.chars().filter(|c| !c.is_whitespace()).collect();
            in_origin = header.eq_ignore_ascii_case("[remote\"origin\"]");
            continue;
        }
        if !in_origin {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if key.trim().eq_ignore_ascii_case("url") {
            let value = value.trim();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value);
            return (!value.is_empty()).then(|| value.to_owned());
        }
    }
    None
}

/// A remote URL as `host/path`: no scheme, user, port, trailing `/` or `.git`; the host in
/// lower case. A local path (`/srv/git/web.git`, `file:///srv/git/web`) is its path.
pub fn remote_identity(url: &str) -> Option<String> {
    let url = url.trim();
    let (host, path) = if let Some((scheme, rest)) = url.split_once("://") {
        if scheme.eq_ignore_ascii_case("file") {
            ("", rest)
        } else {
            let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
            (authority, path)
        }
    } else if url.starts_with('/') {
        ("", url)
    } else {
        // scp-like `user@host:path`; a `:` after a `/` is a local path's.
        match url.split_once(':') {
            Some((authority, path)) if !authority.contains('/') => (authority, path),
            _ => ("", url),
        }
    };
    let host = host.rsplit_once('@').map_or(host, |(_, host)| host);
    let host = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
    .to_ascii_lowercase();
    let path = path.trim_matches('/');
    let path = path
        .strip_suffix(".git")
        .unwrap_or(path)
        .trim_end_matches('/');
    let identity: Vec<&str> = std::iter::once(host.as_str())
        .chain(path.split('/'))
        .filter(|segment| !segment.is_empty())
        .collect();
    (!identity.is_empty()).then(|| identity.join("/"))
}

/// The identity of a root without a remote: its absolute path without the leading `/`.
fn path_identity(root: &Path) -> String {
    root.components()
        .filter_map(|component| match component {
            Component::Normal(part) => Some(part.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn check_identity(identity: &str) -> Result<(), String> {
    let trimmed = identity.trim_matches('/');
    if trimmed.is_empty() {
        return Err("an identity needs at least one part".to_owned());
    }
    trimmed.split('/').try_for_each(check_segment)
}

/// Baton's rule for one part of a name: not empty, not `.` or `..`, no control character.
fn check_segment(segment: &str) -> Result<(), String> {
    if segment.is_empty() {
        return Err("an empty part (`//`)".to_owned());
    }
    if segment == "." || segment == ".." {
        return Err(format!("a {segment:?} part"));
    }
    if segment.chars().any(char::is_control) {
        return Err(format!("a control character in {segment:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_urls_name_their_repository_one_way() {
        let cases = [
            (
                "https://github.com/acme/web.git",
                Some("github.com/acme/web"),
            ),
            ("https://github.com/acme/web", Some("github.com/acme/web")),
            ("https://github.com/acme/web/", Some("github.com/acme/web")),
            ("git@github.com:acme/web.git", Some("github.com/acme/web")),
            (
                "ssh://git@GitHub.com:22/acme/web.git",
                Some("github.com/acme/web"),
            ),
            (
                "https://user:pw@gitlab.example.org:8443/a/b/c.git",
                Some("gitlab.example.org/a/b/c"),
            ),
            ("/srv/git/web.git", Some("srv/git/web")),
            ("file:///srv/git/web", Some("srv/git/web")),
            ("../web.git", Some("../web")),
            ("", None),
        ];
        for (url, identity) in cases {
            assert_eq!(remote_identity(url).as_deref(), identity, "{url}");
        }
    }

    #[test]
    fn the_origin_url_is_read_from_its_section_only() {
        let config = "[core]\n\turl = nope\n[remote \"upstream\"]\n\turl = https://x/up\n\
                      [remote \"origin\"]\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n\
                      \tURL = \"git@github.com:acme/web.git\"\n";
        assert_eq!(
            origin_url(config).as_deref(),
            Some("git@github.com:acme/web.git")
        );
        assert_eq!(origin_url("[remote \"upstream\"]\nurl = a\n"), None);
    }

    /// A temporary tree: `web/` a clone of github.com/acme/web, `tool/` a repository without
    /// a remote, `loose/` no repository at all.
    fn tree() -> (tempfile::TempDir, PathBuf) {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let base = directory.path().canonicalize().expect("canonical");
        std::fs::create_dir_all(base.join("web/.git")).expect("web");
        std::fs::create_dir_all(base.join("web/src")).expect("web/src");
        std::fs::write(
            base.join("web/.git/config"),
            "[remote \"origin\"]\n\turl = https://github.com/acme/web.git\n",
        )
        .expect("config");
        std::fs::create_dir_all(base.join("tool/.git")).expect("tool");
        std::fs::create_dir_all(base.join("loose/sub")).expect("loose");
        (directory, base)
    }

    fn name(path: &Path, working_directory: &Path, naming: &FileNaming) -> String {
        name_file(path, working_directory, naming)
            .expect("a name")
            .resource
    }

    #[test]
    fn a_file_is_one_name_wherever_it_is_named_from() {
        let (_directory, base) = tree();
        let none = FileNaming::default();
        let web = base.join("web");
        let expected = "github.com/acme/web/src/auth.rs";
        assert_eq!(name(Path::new("src/auth.rs"), &web, &none), expected);
        assert_eq!(
            name(Path::new("auth.rs"), &web.join("src"), &none),
            expected
        );
        assert_eq!(
            name(&web.join("src/../src/./auth.rs"), &base, &none),
            expected
        );
        assert_eq!(
            name(&web.join("src/auth.rs"), Path::new("/"), &none),
            expected
        );
        // A repository without a remote is named by its path; no repository, by the file's.
        let tool = base.join("tool");
        let tool_name = format!("{}/x.rs", path_identity(&tool));
        assert_eq!(name(Path::new("x.rs"), &tool, &none), tool_name);
        let loose = base.join("loose");
        let loose_name = format!("{}/b.txt", path_identity(&loose));
        assert_eq!(name(Path::new("b.txt"), &loose, &none), loose_name);
        assert_eq!(
            name(Path::new("../b.txt"), &loose.join("sub"), &none),
            loose_name
        );
        // Two repositories' files of one relative path are two names.
        assert_ne!(
            name(Path::new("src/lib.rs"), &web, &none),
            name(Path::new("src/lib.rs"), &tool, &none)
        );
    }

    #[test]
    fn a_symbolic_link_names_its_target() {
        let (_directory, base) = tree();
        let none = FileNaming::default();
        std::fs::write(base.join("web/src/real.rs"), "").expect("a file");
        std::os::unix::fs::symlink(base.join("web/src/real.rs"), base.join("loose/link.rs"))
            .expect("a link to a file");
        std::os::unix::fs::symlink(base.join("web"), base.join("loose/web-link"))
            .expect("a link to a directory");
        let real = "github.com/acme/web/src/real.rs";
        assert_eq!(name(Path::new("link.rs"), &base.join("loose"), &none), real);
        assert_eq!(
            name(
                Path::new("web-link/src/real.rs"),
                &base.join("loose"),
                &none
            ),
            real
        );
        // A file not created yet, under a linked directory.
        assert_eq!(
            name(
                Path::new("web-link/src/new/mod.rs"),
                &base.join("loose"),
                &none
            ),
            "github.com/acme/web/src/new/mod.rs"
        );
    }

    #[test]
    fn root_and_repo_configure_the_working_directorys_repository_only() {
        let (_directory, base) = tree();
        let web = base.join("web");
        let repo = FileNaming {
            root: None,
            repo: Some("acme-web".to_owned()),
        };
        assert_eq!(
            name(Path::new("src/a.rs"), &web, &repo),
            "acme-web/src/a.rs"
        );
        // Another repository keeps its own identity.
        let tool = base.join("tool");
        assert_eq!(
            name(&tool.join("a.rs"), &web, &repo),
            format!("{}/a.rs", path_identity(&tool))
        );
        let rooted = FileNaming {
            root: Some(PathBuf::from("src")),
            repo: Some("web-src".to_owned()),
        };
        assert_eq!(name(Path::new("src/a.rs"), &web, &rooted), "web-src/a.rs");
        // A root without --repo: its own remote or path.
        let rooted_only = FileNaming {
            root: Some(PathBuf::from("src")),
            repo: None,
        };
        assert_eq!(
            name(Path::new("src/a.rs"), &web, &rooted_only),
            format!("{}/a.rs", path_identity(&web.join("src")))
        );
        let bad = FileNaming {
            root: None,
            repo: Some("a/../b".to_owned()),
        };
        let error = name_file(Path::new("x"), &web, &bad).expect_err("a bad --repo");
        assert!(error.to_string().contains("--repo"), "{error}");
    }

    #[test]
    fn a_worktree_reads_the_config_of_its_common_dir() {
        let (_directory, base) = tree();
        let git_dir = base.join("web/.git/worktrees/feature");
        std::fs::create_dir_all(&git_dir).expect("a worktree's git dir");
        std::fs::write(git_dir.join("commondir"), "../..\n").expect("commondir");
        std::fs::create_dir_all(base.join("feature")).expect("the worktree");
        std::fs::write(
            base.join("feature/.git"),
            format!("gitdir: {}\n", git_dir.display()),
        )
        .expect(".git file");
        assert_eq!(
            name(
                Path::new("src/a.rs"),
                &base.join("feature"),
                &FileNaming::default()
            ),
            "github.com/acme/web/src/a.rs"
        );
    }

    #[test]
    fn names_baton_would_refuse_are_refused_here() {
        let (_directory, base) = tree();
        let none = FileNaming::default();
        let error = name_file(Path::new("a\u{7}b.rs"), &base.join("web"), &none)
            .expect_err("a control character");
        assert!(error.to_string().contains("control character"), "{error}");
        assert!(name_file(Path::new("/"), Path::new("/"), &none).is_err());
    }
}
