//! `batond restore`: one member of a new cluster seeded from a backup file, and `batond
//! recover`: a stopped survivor of a lost majority made a one-member cluster
//! (docs/operations.md).
//!
//! The file is checked whole (magic, format, lengths, checksum, the state decoding) before
//! anything is written, and `store::seed` refuses a data dir that is not empty. The state then starts the
//! next fence epoch (`Machine::begin_fence_epoch`): the old cluster may have granted fences
//! after the backup was cut, and the new one must never grant one of those again. Every member
//! seeded from the same file and `--initial-cluster` holds the same bytes, and the same new
//! cluster id (a recover makes a new one too): a node of the cluster that was lost or replaced,
//! if it still runs, is refused by the new one (network.rs, `Identity`).

use std::collections::BTreeMap;

use anyhow::{bail, Context};
use baton_api::decode_backup;
use baton_raft_store::machine::Machine;
use baton_raft_store::store::{ClusterId, Member};
use sha2::{Digest, Sha256};

use crate::config::{parse_initial_cluster, Recover, Restore};

/// Seeds `restore.data_dir`; returns what to tell the operator.
pub async fn restore(restore: &Restore) -> anyhow::Result<String> {
    let members = parse_initial_cluster(&restore.initial_cluster)?;
    if restore.id == 0 || !members.contains_key(&restore.id) {
        bail!(
            "--initial-cluster must list this member's --id {}",
            restore.id
        );
    }
    let dir = restore.data_dir.display();
    let file = restore.file.display();
    let bytes = tokio::fs::read(&restore.file)
        .await
        .with_context(|| format!("read {file}"))?;
    let (header, state) = decode_backup(&bytes).with_context(|| format!("{file}"))?;
    let mut machine = Machine::decode_snapshot(state)
        .with_context(|| format!("{file}: the state does not decode"))?;
    let epoch = machine.begin_fence_epoch();
    let cluster = restored_cluster(&bytes, &members);
    baton_raft_store::store::seed(&restore.data_dir, &machine, header.index, members, cluster)
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

/// The id of the cluster a restore makes: the same for every member restored from the same file
/// with the same members (each member is restored by a `batond restore` of its own), and
/// another than the backed-up cluster's, whose nodes it then refuses.
fn restored_cluster(backup: &[u8], members: &BTreeMap<u64, Member>) -> ClusterId {
    let mut hasher = Sha256::new();
    hasher.update(b"baton restore\0");
    hasher.update(Sha256::digest(backup));
    for (id, member) in members {
        hasher.update(format!("{id}={member}\0").as_bytes());
    }
    let digest: [u8; 32] = hasher.finalize().into();
    let mut id = [0; 16];
    id.copy_from_slice(&digest[..16]);
    ClusterId(id)
}

/// Replays the survivor's whole log onto its last snapshot, starts the next fence epoch (the
/// lost members may have granted fences this one never saw), and seeds a new data dir with that
/// state and a membership of this member alone, at its own addresses. The new dir is written
/// beside the old one and then swapped in: the old one is kept as `DIR.before-recover`, and a
/// failure before the swap leaves the old dir as it was.
pub async fn recover(recover: &Recover) -> anyhow::Result<String> {
    let dir = &recover.data_dir;
    let shown = dir.display();
    // The replay keeps the dir locked until the swap below is done: no `batond` starts on it
    // meanwhile.
    let replayed = baton_raft_store::store::replay(dir)
        .await
        .with_context(|| format!("read {shown}"))?;
    let (mut machine, applied) = (replayed.machine.clone(), replayed.applied);
    let membership = replayed.membership.membership();
    let Some(me) = membership.get_node(&recover.id).cloned() else {
        let members: Vec<String> = membership
            .nodes()
            .map(|(id, member)| format!("{id}={member}"))
            .collect();
        bail!(
            "node {} is not a member of the cluster {shown} belongs to (members: {}); give the survivor's own --id",
            recover.id,
            members.join(",")
        );
    };
    let index = applied.map_or(0, |log_id| log_id.index);
    let (sessions, leases) = machine.counts();
    let epoch = machine.begin_fence_epoch();
    let beside = |suffix: &str| {
        let mut name = dir.as_os_str().to_owned();
        name.push(suffix);
        std::path::PathBuf::from(name)
    };
    let (fresh, kept) = (beside(".recovering"), beside(".before-recover"));
    for path in [&fresh, &kept] {
        if path.exists() {
            bail!(
                "{} exists: an earlier recover? Move it away first",
                path.display()
            );
        }
    }
    let members = BTreeMap::from([(recover.id, me.clone())]);
    // A new cluster: the lost members, should one come back, are refused by this one.
    let cluster = ClusterId(rand::random());
    baton_raft_store::store::seed(&fresh, &machine, index, members, cluster)
        .await
        .with_context(|| format!("seed {}", fresh.display()))?;
    std::fs::rename(dir, &kept)
        .and_then(|()| std::fs::rename(&fresh, dir))
        .and_then(|()| match dir.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => {
                std::fs::File::open(parent)?.sync_all()
            }
            _ => std::fs::File::open(".")?.sync_all(),
        })
        .with_context(|| format!("swap {} into {shown}", fresh.display()))?;
    drop(replayed); // the old dir's lock, now DIR.before-recover's
    Ok(format!(
        "recovered {shown} as a one-member cluster of node {} at {me} (index {index}, {leases} leases, {sessions} sessions); fences resume at epoch {epoch}, above {}. The old dir is {}. Start it with `batond run --id {} --data-dir {shown} ...`, then add members with `baton cluster add`",
        recover.id,
        machine.fence_counter(),
        kept.display(),
        recover.id,
    ))
}
