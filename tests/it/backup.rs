//! Backups and recovery (docs/operations.md): `baton snapshot save` and `inspect` against real
//! nodes, and a new cluster seeded by `batond restore` that holds every write acknowledged before
//! the save and never grants a fence the old cluster could have granted. A damaged backup, or a
//! data dir in use, is refused before anything is written. `batond recover` makes the survivor
//! of a lost majority a one-member cluster that grows back.

use std::path::Path;

use baton_client::api::{BackupHeader, Digest, Grant, KvEntry, Lease};
use baton_tests::{
    batond_path, free_port, path_with_baton, poll_until, snippet, Cluster, ClusterConfig,
};
use serde_json::json;

use crate::cli::baton;

/// How long a state may take to reach every member.
const STATE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Every endpoint of `cluster`, for the `baton` command line.
fn endpoints(cluster: &Cluster) -> String {
    cluster
        .nodes()
        .iter()
        .map(|node| node.api_url())
        .collect::<Vec<_>>()
        .join(",")
}

async fn grant(cluster: &Cluster, resource: &str) -> Grant {
    let node = cluster.leader().await;
    cluster
        .api()
        .post(
            node,
            "/v1/leases",
            &json!({"resource": resource, "holder": "filler", "ttl_ms": 60_000}),
        )
        .await
        .expect_json(201)
}

/// Runs `command` to its end: its exit code and its stdout and stderr together.
fn run(command: &mut std::process::Command) -> (Option<i32>, String) {
    let output = command.output().expect("run a command");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), said)
}

/// `batond restore ARGS`.
fn restore(args: &[&std::ffi::OsStr]) -> (Option<i32>, String) {
    run(std::process::Command::new(batond_path())
        .arg("restore")
        .args(args))
}

/// The whole cluster is lost after a backup; a new one restored from the file holds every write
/// acknowledged before the save, with the leases' fences, and every fence it grants is above
/// every fence the old cluster granted, also those granted after the save.
#[tokio::test]
async fn a_cluster_restored_from_a_backup_holds_what_was_acknowledged_and_never_reissues_a_fence() {
    let old = Cluster::start(3).await;
    let api = old.api();
    let mut held = Vec::new();
    for n in 0..8 {
        held.push(grant(&old, &format!("repo/file-{n}")).await);
        let writer = &old.nodes()[n % 3];
        api.put(writer, &format!("/v1/kv/config/{n}"), &json!({"value": n}))
            .await
            .expect_status(200);
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cluster.backup");
    let file_arg = file.to_str().unwrap();
    let saved = baton(&endpoints(&old), &["--json", "snapshot", "save", file_arg]).await;
    saved.expect_code(0);
    let header: BackupHeader = saved.json();
    let highest_saved = held.iter().map(|grant| grant.fence).max().unwrap();
    assert_eq!(header.fence, highest_saved, "{header:?}");
    assert_eq!(header.leases, 8, "{header:?}");
    assert_eq!(header.members.len(), 3, "{header:?}");
    let inspected = baton(
        "http://127.0.0.1:9",
        &["--json", "snapshot", "inspect", file_arg],
    )
    .await;
    assert_eq!(inspected.expect_code(0).json::<BackupHeader>(), header);

    // After the save, the old cluster goes on: fences and writes the backup does not hold.
    let mut after = Vec::new();
    for n in 0..5 {
        after.push(grant(&old, &format!("later/{n}")).await.fence);
    }
    api.put(
        old.nodes().first().unwrap(),
        "/v1/kv/config/late",
        &json!({"value": "late"}),
    )
    .await
    .expect_status(200);
    let highest_ever = *after.iter().max().unwrap();
    assert!(highest_ever > highest_saved);
    old.kill_all();

    let restored = Cluster::start_with(ClusterConfig {
        restore_from: Some(file.clone()),
        ..ClusterConfig::new(3)
    })
    .await;
    let api = restored.api();
    for n in 0..8 {
        let reader = &restored.nodes()[(n + 1) % 3];
        let entry: KvEntry = api
            .get(reader, &format!("/v1/kv/config/{n}"))
            .await
            .expect_json(200);
        assert_eq!(entry.value, json!(n));
    }
    api.get(restored.nodes().first().unwrap(), "/v1/kv/config/late")
        .await
        .expect_status(404);
    for grant in &held {
        let lease: Lease = api
            .get(
                restored.nodes().last().unwrap(),
                &format!("/v1/leases/{}", grant.resource),
            )
            .await
            .expect_json(200);
        assert_eq!(lease.fence, grant.fence, "{lease:?}");
    }
    for n in 0..3 {
        let fence = grant(&restored, &format!("after-restore/{n}")).await.fence;
        assert!(
            fence > highest_ever,
            "fence {fence} after the restore, {highest_ever} granted by the old cluster"
        );
    }
}

/// A truncated, damaged, newer-format or foreign file is refused by `inspect` (exit 2) and by
/// `restore` (exit 1), each naming what is wrong, and `restore` writes nothing; a data dir that
/// is not empty is refused and left as it was; a save that cannot write its file leaves no file
/// and changes nothing in the cluster.
#[tokio::test]
async fn a_damaged_backup_or_a_used_data_dir_is_refused_before_anything_is_written() {
    let cluster = Cluster::start(1).await;
    let endpoints = endpoints(&cluster);
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.backup");
    baton(&endpoints, &["snapshot", "save", good.to_str().unwrap()])
        .await
        .expect_code(0);
    let bytes = std::fs::read(&good).unwrap();

    let mut flipped = bytes.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x01;
    let mut newer = bytes.clone();
    newer[8..12].copy_from_slice(&2_u32.to_le_bytes());
    let damaged: [(&str, Vec<u8>, &str); 4] = [
        ("truncated", bytes[..bytes.len() - 10].to_vec(), "truncated"),
        ("flipped", flipped, "checksum mismatch"),
        ("newer", newer, "backup format 2; this build reads format 1"),
        ("foreign", b"{\"index\": 1}".to_vec(), "not a Baton backup"),
    ];
    let members = format!("1={}@127.0.0.1:1", cluster.node(1).api_addr());
    for (name, content, says) in damaged {
        let file = dir.path().join(format!("{name}.backup"));
        std::fs::write(&file, content).unwrap();
        let inspected = baton(&endpoints, &["snapshot", "inspect", file.to_str().unwrap()]).await;
        inspected.expect_code(2);
        assert!(
            inspected
                .error_line()
                .starts_with("error[INVALID_ARGUMENT]")
                && inspected.error_line().contains(says),
            "{name}: {inspected:#?}"
        );
        let data_dir = dir.path().join(format!("{name}-node"));
        let (code, said) = restore(&[
            file.as_os_str(),
            "--id".as_ref(),
            "1".as_ref(),
            "--data-dir".as_ref(),
            data_dir.as_os_str(),
            "--initial-cluster".as_ref(),
            members.as_ref(),
        ]);
        assert_eq!(code, Some(1), "{name}: {said}");
        assert!(said.contains(says), "{name}: {said}");
        assert!(
            !data_dir.exists(),
            "{name}: restore wrote {}",
            data_dir.display()
        );
    }

    // A data dir in use: refused, and what is in it stays.
    let used = dir.path().join("used");
    std::fs::create_dir(&used).unwrap();
    std::fs::write(used.join("vote"), b"mine").unwrap();
    let (code, said) = restore(&[
        good.as_os_str(),
        "--id".as_ref(),
        "1".as_ref(),
        "--data-dir".as_ref(),
        used.as_os_str(),
        "--initial-cluster".as_ref(),
        members.as_ref(),
    ]);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("is not empty"), "{said}");
    assert_eq!(std::fs::read_dir(&used).unwrap().count(), 1);
    assert_eq!(std::fs::read(used.join("vote")).unwrap(), b"mine");

    // A save where no file can be made: it fails, leaves nothing, and the cluster serves on.
    let nowhere = dir.path().join("no-such-dir").join("x.backup");
    let failed = baton(&endpoints, &["snapshot", "save", nowhere.to_str().unwrap()]).await;
    failed.expect_code(1);
    assert!(!nowhere.exists() && !Path::new(&format!("{}.partial", nowhere.display())).exists());
    baton(&endpoints, &["kv", "put", "after/failed-save", "1"])
        .await
        .expect_code(0);
}

/// docs/operations.md's scripts as written: `backup.sh` saves and keeps the newest seven;
/// `restore.sh` seeds every member of a new cluster, which then starts with `batond run` and
/// serves what the backup holds.
/// `baton snapshot save -` writes the backup to stdout, and `inspect -` reads one from stdin.
/// A stdout that fails (a reader that closed the pipe, a full disk: /dev/full) is exit 1 with
/// the reason, and the cluster is unaffected (it goes on granting fences one above the last).
#[tokio::test]
async fn a_backup_through_a_pipe_and_a_stdout_that_fails() {
    use std::process::{Command, Stdio};
    let cluster = Cluster::start(1).await;
    let endpoints = endpoints(&cluster);
    let before = grant(&cluster, "piped").await;
    let save = |stdout: Stdio| {
        Command::new(baton_tests::baton_path())
            .args(["--endpoints", &endpoints, "snapshot", "save", "-"])
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start baton")
    };

    let saved = save(Stdio::piped()).wait_with_output().unwrap();
    assert_eq!(saved.status.code(), Some(0), "{saved:?}");
    let (header, _) = baton_client::api::decode_backup(&saved.stdout).expect("a whole backup");
    assert_eq!(header.fence, before.fence);
    assert!(String::from_utf8_lossy(&saved.stderr).contains("saved to stdout: index"));
    let mut inspect = Command::new(baton_tests::baton_path())
        .args(["snapshot", "inspect", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut inspect.stdin.take().unwrap(), &saved.stdout).unwrap();
    let inspected = inspect.wait_with_output().unwrap();
    assert_eq!(inspected.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&inspected.stdout)
        .contains(&format!("highest fence {}", before.fence)));

    // A reader that is gone before the backup is written.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let closed = save(Stdio::from(writer)).wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&closed.stderr);
    assert_eq!(closed.status.code(), Some(1), "{said}");
    assert!(
        said.contains("cannot write the backup to stdout") && said.contains("Broken pipe"),
        "{said}"
    );

    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let refused = save(Stdio::from(full)).wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(said.contains("No space left on device"), "{said}");

    let after = grant(&cluster, "after-the-failed-saves").await;
    assert_eq!(after.fence, before.fence + 1);
}

/// A backup is streamed as it is encoded, its length announced first; clients that go away
/// after the answer's start leave the node serving.
#[tokio::test]
async fn a_backup_is_streamed_with_its_length_and_a_client_may_leave_midway() {
    let cluster = Cluster::start(1).await;
    for index in 0..50 {
        grant(&cluster, &format!("streamed/{index}")).await;
    }
    let before = grant(&cluster, "streamed/last").await;
    let url = format!("{}/v1/snapshot", cluster.nodes()[0].api_url());
    let http = reqwest::Client::new();
    let answer = http.get(&url).send().await.expect("a backup");
    assert_eq!(answer.status(), 200);
    let announced = answer.content_length().expect("a Content-Length");
    let bytes = answer.bytes().await.expect("the whole backup");
    assert_eq!(bytes.len() as u64, announced);
    let (header, state) = baton_client::api::decode_backup(&bytes).expect("a whole backup");
    assert_eq!(header.fence, before.fence);
    assert_eq!(header.state_bytes, state.len() as u64);

    for _ in 0..20 {
        let answer = http.get(&url).send().await.expect("a backup");
        assert_eq!(answer.status(), 200);
        drop(answer);
    }
    let after = grant(&cluster, "after-the-abandoned-backups").await;
    assert_eq!(after.fence, before.fence + 1);
}

#[tokio::test]
async fn the_documented_backup_and_restore_scripts_work() {
    let old = Cluster::start(1).await;
    let api = old.api();
    api.put(
        old.node(1),
        "/v1/kv/deploy/version",
        &json!({"value": "v42"}),
    )
    .await
    .expect_status(200);
    let dir = tempfile::tempdir().unwrap();
    let scripts = dir.path();
    for name in ["backup.sh", "restore.sh"] {
        std::fs::write(scripts.join(name), snippet("docs/operations.md", name)).unwrap();
    }
    let backups = scripts.join("backups");
    std::fs::create_dir(&backups).unwrap();
    let path = format!(
        "{}:{}",
        batond_path().parent().unwrap().display(),
        path_with_baton()
    );
    let script = |args: &[&std::ffi::OsStr]| {
        let (code, said) = run(std::process::Command::new("sh")
            .args(args)
            .env("PATH", &path)
            .env("BATON_ENDPOINTS", old.node(1).api_url()));
        assert_eq!(code, Some(0), "{args:?}: {said}");
        said
    };
    for _ in 0..9 {
        script(&[scripts.join("backup.sh").as_os_str(), backups.as_os_str()]);
    }
    let mut kept: Vec<_> = std::fs::read_dir(&backups)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    kept.sort();
    assert_eq!(kept.len(), 7, "{kept:?}");
    let newest = kept.last().unwrap();

    let ports: Vec<(u64, u16, u16)> = (1..=3).map(|id| (id, free_port(), free_port())).collect();
    let members = ports
        .iter()
        .map(|(id, api_port, peer_port)| format!("{id}=127.0.0.1:{api_port}@127.0.0.1:{peer_port}"))
        .collect::<Vec<_>>()
        .join(",");
    let root = scripts.join("new-cluster");
    let said = script(&[
        scripts.join("restore.sh").as_os_str(),
        newest.as_os_str(),
        members.as_ref(),
        root.as_os_str(),
    ]);
    assert!(said.contains("fences resume at epoch 1"), "{said}");
    let _members: Vec<tokio::process::Child> = ports
        .iter()
        .map(|(id, api_port, peer_port)| {
            tokio::process::Command::new(batond_path())
                .args(["run", "--id", &id.to_string()])
                .arg("--data-dir")
                .arg(root.join(format!("node-{id}")))
                .args(["--listen", &format!("127.0.0.1:{api_port}")])
                .args(["--peer-listen", &format!("127.0.0.1:{peer_port}")])
                .args(["--initial-cluster", &members])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("start batond run")
        })
        .collect();
    let endpoints = ports
        .iter()
        .map(|(_, api_port, _)| format!("http://127.0.0.1:{api_port}"))
        .collect::<Vec<_>>()
        .join(",");
    let read = baton(&endpoints, &["--json", "kv", "get", "deploy/version"]).await;
    assert_eq!(read.expect_code(0).json::<KvEntry>().value, json!("v42"));
}

/// GET `url`'s digest of its applied state: (applied index, digest).
async fn digest_at(url: &str) -> Option<(u64, String)> {
    let answer = reqwest::get(format!("{url}/v1/debug/digest")).await.ok()?;
    let digest: Digest = answer.json().await.ok()?;
    Some((digest.applied_index, digest.digest))
}

/// A majority lost for good: two of three nodes are killed and never come back. `batond
/// recover` on the stopped survivor makes it a one-member cluster holding all it had; it serves
/// at once, grants fences above every fence of the old cluster, and two fresh members added
/// with `POST /v1/cluster/members` end with the same state as it.
#[tokio::test]
async fn a_survivor_of_a_lost_majority_is_recovered_and_grown_back_to_three() {
    let cluster = Cluster::start(3).await;
    let api = cluster.api();
    let leader = cluster.leader().await;
    let survivor = cluster.followers().await[0];
    let mut fences = Vec::new();
    for n in 0..6 {
        fences.push(grant(&cluster, &format!("work/{n}")).await.fence);
        api.put(leader, &format!("/v1/kv/state/{n}"), &json!({"value": n}))
            .await
            .expect_status(200);
    }
    // The survivor holds what the leader holds (a majority loss may take acknowledged writes
    // with it when the survivor lags: not what this test is about).
    let leader_url = leader.api_url();
    let survivor_url = survivor.api_url();
    poll_until(
        STATE_TIMEOUT,
        "the survivor to hold the leader's state",
        async || {
            let (leading, surviving) =
                tokio::join!(digest_at(&leader_url), digest_at(&survivor_url));
            (leading.is_some() && leading == surviving).then_some(())
        },
    )
    .await;
    for node in cluster.nodes() {
        node.kill();
    }

    let data_dir = survivor.data_dir();
    let recover = || {
        run(std::process::Command::new(batond_path())
            .args(["recover", "--id", &survivor.id.to_string()])
            .arg("--data-dir")
            .arg(data_dir))
    };
    let mut kept = data_dir.as_os_str().to_owned();
    kept.push(".before-recover");
    // Not a member of that cluster, or not a data dir: refused, nothing moved.
    let (code, said) = run(std::process::Command::new(batond_path())
        .args(["recover", "--id", "99", "--data-dir"])
        .arg(data_dir));
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("node 99 is not a member"), "{said}");
    let empty = tempfile::tempdir().unwrap();
    let (code, said) = run(std::process::Command::new(batond_path())
        .args(["recover", "--id", "1", "--data-dir"])
        .arg(empty.path()));
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("holds no store"), "{said}");
    assert!(!Path::new(&kept).exists());

    let (code, said) = recover();
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("fences resume at epoch 1"), "{said}");
    assert!(Path::new(&kept).is_dir(), "{said}");
    // Once done, a second recover of the same dir is refused: the kept dir is in the way.
    let (code, again) = recover();
    assert_eq!(code, Some(1), "{again}");
    assert!(again.contains("an earlier recover?"), "{again}");

    survivor.restart();
    assert_eq!(cluster.leader().await.id, survivor.id);
    let fence = grant(&cluster, "after-recover").await.fence;
    assert!(fence > *fences.iter().max().unwrap(), "fence {fence}");

    let dir = tempfile::tempdir().unwrap();
    let mut members = Vec::new();
    for id in [11_u64, 12] {
        let (api_port, peer_port) = (free_port(), free_port());
        let child = tokio::process::Command::new(batond_path())
            .args(["run", "--id", &id.to_string()])
            .arg("--data-dir")
            .arg(dir.path().join(format!("node-{id}")))
            .args(["--listen", &format!("127.0.0.1:{api_port}")])
            .args(["--peer-listen", &format!("127.0.0.1:{peer_port}")])
            .args(["--heartbeat-ms", "50", "--election-timeout-ms", "300"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start a new member");
        api.post(
            survivor,
            "/v1/cluster/members",
            &json!({"id": id, "api_addr": format!("127.0.0.1:{api_port}"),
                    "peer_addr": format!("127.0.0.1:{peer_port}")}),
        )
        .await
        .expect_status(200);
        members.push((child, format!("http://127.0.0.1:{api_port}")));
    }
    poll_until(
        STATE_TIMEOUT,
        "the new members to hold the survivor's state",
        async || {
            let here = digest_at(&survivor_url).await?;
            for (_, url) in &members {
                if digest_at(url).await? != here {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    for (_, url) in &members {
        for n in 0..6 {
            let read = baton(url, &["--json", "kv", "get", &format!("state/{n}")]).await;
            assert_eq!(read.expect_code(0).json::<KvEntry>().value, json!(n));
        }
    }
}

/// Runs `command` to its end within 30 s: its exit code and what it said. A command that runs
/// longer (a second `batond` serving the same data dir) is killed and the test fails.
async fn run_bounded(command: &mut tokio::process::Command) -> (Option<i32>, String) {
    let child = command.kill_on_drop(true).output();
    let output = tokio::time::timeout(std::time::Duration::from_secs(30), child)
        .await
        .expect("the command ends within 30 s")
        .expect("run a command");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), said)
}

/// A data dir belongs to one process: a second `batond` started on a running member's data dir,
/// and `batond recover` beside it, are refused naming the dir, and the member goes on serving
/// with nothing in its dir moved.
#[tokio::test]
async fn a_data_dir_in_use_is_refused_to_a_second_batond_and_to_recover() {
    let cluster = Cluster::start(1).await;
    let node = &cluster.nodes()[0];
    let before = grant(&cluster, "in-use/before").await.fence;
    let data_dir = node.data_dir();

    let (code, said) = run_bounded(
        tokio::process::Command::new(batond_path())
            .args(["run", "--id", "1", "--data-dir"])
            .arg(data_dir)
            .args(["--listen", &format!("127.0.0.1:{}", free_port())])
            .args(["--peer-listen", &format!("127.0.0.1:{}", free_port())]),
    )
    .await;
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("is in use by another process"), "{said}");
    assert!(said.contains(&data_dir.display().to_string()), "{said}");

    let (code, said) = run_bounded(
        tokio::process::Command::new(batond_path())
            .args(["recover", "--id", "1", "--data-dir"])
            .arg(data_dir),
    )
    .await;
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("is in use by another process"), "{said}");
    let mut kept = data_dir.as_os_str().to_owned();
    kept.push(".before-recover");
    assert!(!Path::new(&kept).exists(), "{said}");

    let after = grant(&cluster, "in-use/after").await.fence;
    assert!(after > before, "fences {before} then {after}");
    // Once the member is stopped its dir opens again.
    node.kill();
    node.restart();
    let again = grant(&cluster, "in-use/again").await.fence;
    assert!(again > after, "fences {after} then {again}");
}
