//! `baton token` and `baton limits`, the admin calls of access control (docs/security.md), and
//! `baton snapshot`, backups (docs/operations.md).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use baton_client::api::{
    decode_backup, BackupError, BackupHeader, CreateTokenRequest, TokenInfo, TokenQuotas, TokenRole,
};
use baton_client::Client;
use serde_json::Value;

use super::output::{note, print_json, say, Failure, EXIT_FAILURE, EXIT_OK, EXIT_USAGE};
use super::{LimitsCommand, SnapshotCommand, TokenCommand, TokenRoleArg};

/// The FILE of `snapshot save` and `snapshot inspect` that means stdout or stdin.
const STDIO: &str = "-";

pub async fn token(client: &Client, command: TokenCommand, json: bool) -> Result<u8, Failure> {
    match command {
        TokenCommand::Create {
            name,
            role,
            namespaces,
            sessions_max,
            leases_max,
        } => {
            let request = CreateTokenRequest {
                name,
                role: match role {
                    TokenRoleArg::Reader => TokenRole::Reader,
                    TokenRoleArg::Agent => TokenRole::Agent,
                    TokenRoleArg::Admin => TokenRole::Admin,
                },
                namespaces,
                quotas: (sessions_max.is_some() || leases_max.is_some()).then_some(TokenQuotas {
                    sessions_max,
                    leases_max,
                }),
            };
            let created = client.create_token(&request).await?;
            if json {
                print_json(&created);
            } else {
                // The secret alone on stdout, so `export BATON_TOKEN=$(baton token create ...)`
                // works; what it is goes to stderr.
                note!(
                    "created token {}: keep this secret, it is not shown again",
                    describe(&created.token)
                );
                say!("{}", created.secret);
            }
        }
        TokenCommand::List => {
            let list = client.list_tokens().await?;
            if json {
                print_json(&list);
            } else {
                for token in &list.tokens {
                    say!("{}", describe(token));
                }
            }
        }
        TokenCommand::Revoke { name } => {
            let revoked = client.revoke_token(&name).await?;
            if json {
                print_json(&revoked);
            } else {
                say!("revoked token {}", revoked.name);
            }
        }
    }
    Ok(EXIT_OK)
}

/// `team-a role=agent namespaces=team-a,shared created 2026-12-02T01:33:49Z`.
fn describe(token: &TokenInfo) -> String {
    let role = match token.role {
        TokenRole::Reader => "reader",
        TokenRole::Agent => "agent",
        TokenRole::Admin => "admin",
    };
    let mut quotas = String::new();
    if let Some(sessions_max) = token.quotas.sessions_max {
        quotas += &format!(" sessions_max={sessions_max}");
    }
    if let Some(leases_max) = token.quotas.leases_max {
        quotas += &format!(" leases_max={leases_max}");
    }
    format!(
        "{} role={role} namespaces={}{quotas} created {}",
        token.name,
        token.namespaces.join(","),
        token.created_at
    )
}

pub async fn limits(client: &Client, command: LimitsCommand, json: bool) -> Result<u8, Failure> {
    let limits = match command {
        LimitsCommand::Get => client.limits().await?,
        LimitsCommand::Set { changes } => {
            let changes = changes
                .into_iter()
                .map(|(name, value)| (name, Value::from(value)))
                .collect();
            client.set_limits(&changes).await?
        }
    };
    if json {
        print_json(&limits);
    } else if let Value::Object(limits) = &limits {
        for (name, value) in limits {
            say!("{name}={value}");
        }
    }
    Ok(EXIT_OK)
}

/// `baton snapshot save FILE`: the backup goes to `FILE.partial` beside FILE, is synced and
/// checked whole, and only then renamed over FILE (its directory synced): FILE is never a
/// partial backup, and a failure (a full disk, a broken answer) leaves no file and nothing
/// changed in the cluster. `baton snapshot inspect FILE`: checks a file and prints its header.
pub async fn snapshot(
    client: &Client,
    command: SnapshotCommand,
    json: bool,
) -> Result<u8, Failure> {
    match command {
        SnapshotCommand::Save { file } if file == Path::new(STDIO) => {
            // stdout carries the backup, so what was saved goes to stderr.
            let header = save_to_stdout(client).await?;
            note!("saved to stdout: {}", describe_backup(&header));
        }
        SnapshotCommand::Save { file } => {
            let header = save(client, &file).await?;
            if json {
                print_json(&header);
            } else {
                say!("saved {}: {}", file.display(), describe_backup(&header));
            }
        }
        SnapshotCommand::Inspect { file } => {
            let read = if file == Path::new(STDIO) {
                let mut bytes = Vec::new();
                std::io::stdin().read_to_end(&mut bytes).map(|_| bytes)
            } else {
                std::fs::read(&file)
            };
            let bytes = read.map_err(|error| {
                Failure::new(
                    EXIT_FAILURE,
                    "UNAVAILABLE",
                    format!("cannot read {}: {error}", file.display()),
                )
            })?;
            let (header, _) = decode_backup(&bytes).map_err(|error| refused(&file, &error))?;
            if json {
                print_json(&header);
            } else {
                say!("{}: {}", file.display(), describe_backup(&header));
                say!("members: {}", header.members.join(","));
                say!("saved by node {} at {}", header.saved_by, header.saved_at);
            }
        }
    }
    Ok(EXIT_OK)
}

async fn save(client: &Client, file: &Path) -> Result<BackupHeader, Failure> {
    let failed = |what: &str, error: &dyn std::fmt::Display| {
        Failure::new(
            EXIT_FAILURE,
            "UNAVAILABLE",
            format!("{what} {}: {error}", file.display()),
        )
    };
    let mut partial_name = file.as_os_str().to_owned();
    partial_name.push(".partial");
    let partial = PathBuf::from(partial_name);
    let saved = async {
        let mut out = tokio::fs::File::create(&partial)
            .await
            .map_err(|error| failed("cannot create a file beside", &error))?;
        client.save_snapshot(&mut out).await?;
        out.sync_all()
            .await
            .map_err(|error| failed("cannot sync", &error))?;
        drop(out);
        let bytes = tokio::fs::read(&partial)
            .await
            .map_err(|error| failed("cannot read back", &error))?;
        let (header, _) = decode_backup(&bytes).map_err(|error| refused(file, &error))?;
        tokio::fs::rename(&partial, file)
            .await
            .map_err(|error| failed("cannot rename the backup to", &error))?;
        let dir = match file.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        std::fs::File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(|error| failed("cannot sync the directory of", &error))?;
        Ok(header)
    }
    .await;
    if saved.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    saved
}

/// `baton snapshot save -`: the whole backup is received and checked first, then written to
/// stdout, so a pipe never carries a partial backup that looks whole. A stdout that fails (a
/// closed pipe, a full disk) is a failure with exit 1; the cluster is not touched either way.
async fn save_to_stdout(client: &Client) -> Result<BackupHeader, Failure> {
    let mut bytes = Vec::new();
    client.save_snapshot(&mut bytes).await?;
    let (header, _) = decode_backup(&bytes).map_err(|error| refused(Path::new(STDIO), &error))?;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&bytes)
        .and_then(|()| stdout.flush())
        .map_err(|error| {
            Failure::new(
                EXIT_FAILURE,
                "UNAVAILABLE",
                format!("cannot write the backup to stdout: {error}"),
            )
        })?;
    Ok(header)
}

/// A backup file that cannot be used: bad input, nothing written.
fn refused(file: &Path, error: &BackupError) -> Failure {
    Failure::new(
        EXIT_USAGE,
        "INVALID_ARGUMENT",
        format!("{} is refused: {error}", file.display()),
    )
}

fn describe_backup(header: &BackupHeader) -> String {
    format!(
        "index {}, term {}, cluster time {} ms, {} leases, {} sessions, highest fence {}, {} bytes of state",
        header.index,
        header.term,
        header.cluster_time_ms,
        header.leases,
        header.sessions,
        header.fence,
        header.state_bytes
    )
}
