//! The earlier release a rolling-upgrade run starts from (`--upgrade-from REV`): its `batond`,
//! built once from the repository's own history and cached under
//! `target/upgrade-from/<commit>/batond`, so that every later change of the data or wire format
//! is tried against the release before it the same way.
//!
//! The build uses a detached `git worktree` of that commit and a target directory of its own
//! (seeded with a copy of the current release build's dependencies, so only what differs is
//! compiled), both removed once the binary is cached. What must never live here: anything about the run.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// The crates of an earlier release that the current build's dependencies never supply.
const EARLIER_CRATES_BUILT_QUICKLY: [&str; 5] = [
    "baton-node",
    "baton-raft-store",
    "baton-machine",
    "baton-api",
    "openraft",
];

/// The `batond` of commit `revision` of the repository around the current directory, built
/// (release profile) unless it is cached already.
pub fn earlier_batond(revision: &str) -> anyhow::Result<PathBuf> {
    let top = git(Path::new("."), &["rev-parse", "--show-toplevel"])
        .context("--upgrade-from needs the Baton repository around the current directory")?;
    let top = PathBuf::from(top);
    let commit = git(
        &top,
        &["rev-parse", "--verify", &format!("{revision}^{{commit}}")],
    )
    .with_context(|| format!("--upgrade-from {revision}: no such commit"))?;
    let cache = top.join("target").join("upgrade-from").join(&commit);
    let batond = cache.join("batond");
    if batond.is_file() {
        return Ok(batond);
    }
    let source = cache.join("src");
    let target = cache.join("target");
    if source.exists() {
        // A build a crash interrupted: start over.
        let _ = git(&top, &["worktree", "remove", "--force", path_str(&source)?]);
        let _ = std::fs::remove_dir_all(&source);
    }
    eprintln!("baton-jepsen: building batond of {revision} ({commit}) for the upgrade run, once");
    git(
        &top,
        &["worktree", "add", "--detach", path_str(&source)?, &commit],
    )?;
    seed_from_current_build(&top.join("target").join("release"), &target.join("release"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build.args(["build", "--release", "-p", "baton-node", "--bin", "batond"]);
    // What the seeded dependencies cannot give, Baton's own crates and the openraft of that
    // release, is compiled at opt-level 1: the same code, built faster, which matters to a
    // run on a fresh machine (CI; 2 min 45 s there, without a figure at opt-level 3 on an idle
    // machine to compare with). The other crates' settings stay as they are, so the seeded
    // artifacts still match.
    for package in EARLIER_CRATES_BUILT_QUICKLY {
        build.args([
            "--config",
            &format!("profile.release.package.{package}.opt-level=1"),
        ]);
    }
    let built = build
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(&source)
        .status()
        .context("running cargo")?;
    let copied = if built.success() {
        std::fs::copy(target.join("release").join("batond"), &batond)
            .map(drop)
            .context("caching the built batond")
    } else {
        Err(anyhow::anyhow!(
            "cargo build of {revision} failed ({built})"
        ))
    };
    let _ = git(&top, &["worktree", "remove", "--force", path_str(&source)?]);
    let _ = std::fs::remove_dir_all(&target);
    copied?;
    Ok(batond)
}

/// Copies the current release build's compiled dependencies into the earlier release's target
/// directory, so that cargo rebuilds only what differs (the crates of a different version, and
/// Baton's own) instead of every dependency. Only a saving: what does not match cargo rebuilds,
/// and a copy that fails leaves a full build. A copy, not hard links: rustc writes some outputs
/// in place, which would change the current build's files.
fn seed_from_current_build(current: &Path, earlier: &Path) {
    if !current.join("deps").is_dir() || std::fs::create_dir_all(earlier).is_err() {
        return;
    }
    let copied = Command::new("cp")
        .arg("-a")
        .args(["deps", "build", ".fingerprint"].map(|part| current.join(part)))
        .arg(earlier)
        .status();
    if !copied.is_ok_and(|status| status.success()) {
        eprintln!("baton-jepsen: could not copy the current build's dependencies; building all");
    }
}

/// `git ARGS` in `directory`: its trimmed standard output, or an error with its standard error.
fn git(directory: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(directory)
        .output()
        .context("running git")?;
    if !output.status.success() {
        bail!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))
}
