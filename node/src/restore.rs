//! `batond restore`: one member of a new cluster seeded from a backup file (docs/operations.md).
//!
//! The file is checked whole (magic, format, lengths, checksum, the state decoding) before
//! anything is written, and the data dir must be absent or empty. The state then starts the
//! next fence epoch (`Machine::begin_fence_epoch`): the old cluster may have granted fences
//! after the backup was cut, and the new one must never grant one of those again. Every member
//! seeded from the same file and `--initial-cluster` holds the same bytes.

use anyhow::{bail, Context};
use baton_api::decode_backup;
use baton_raft_store::machine::Machine;

use crate::config::{parse_initial_cluster, Restore};

/// Seeds `restore.data_dir`; returns what to tell the operator.
pub async fn run(restore: &Restore) -> anyhow::Result<String> {
    let members = parse_initial_cluster(&restore.initial_cluster)?;
    if restore.id == 0 || !members.contains_key(&restore.id) {
        bail!(
            "--initial-cluster must list this member's --id {}",
            restore.id
        );
    }
    let dir = restore.data_dir.display();
    let occupied = match std::fs::read_dir(&restore.data_dir) {
        Ok(mut entries) => entries.next().is_some(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => false,
        Err(error) => bail!("--data-dir {dir}: {error}"),
    };
    if occupied {
        bail!("--data-dir {dir} is not empty: a restore seeds a new member's data dir, never one in use");
    }
    let file = restore.file.display();
    let bytes = tokio::fs::read(&restore.file)
        .await
        .with_context(|| format!("read {file}"))?;
    let (header, state) = decode_backup(&bytes).with_context(|| format!("{file}"))?;
    let mut machine = Machine::decode_snapshot(state)
        .with_context(|| format!("{file}: the state does not decode"))?;
    let epoch = machine.begin_fence_epoch();
    baton_raft_store::store::seed(&restore.data_dir, &machine, header.index, members)
        .await
        .with_context(|| format!("seed {dir}"))?;
    Ok(format!(
        "restored {file} (index {}, cluster time {} ms, {} leases, highest fence {}) into {} as member {}; fences resume at epoch {epoch}, above {}. Start it with `batond run --id {} --data-dir {} ...`",
        header.index,
        header.cluster_time_ms,
        header.leases,
        header.fence,
        dir,
        restore.id,
        machine.fence_counter(),
        restore.id,
        dir,
    ))
}
