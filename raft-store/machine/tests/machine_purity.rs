//! The lease state machine must stay pure (STYLE rule 1): this test reads every source file of
//! `raft-store/src/machine/` and fails if any of them names an I/O, clock, async, randomness,
//! hash-ordered collection, or openraft/sled/tokio item.

use std::path::Path;

const FORBIDDEN: &[&str] = &[
    "openraft",
    "sled",
    "tokio",
    "async ",
    ".await",
    "std::time",
    "Instant",
    "SystemTime",
    "std::fs",
    "std::net",
    "std::io",
    "std::thread",
    "std::env",
    "rand::",
    "HashMap",
    "HashSet",
];

#[test]
fn the_machine_module_imports_no_io_clock_or_consensus_crate() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("machine dir") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_none_or(|extension| extension != "rs") {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("readable source");
        for (number, line) in source.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for word in FORBIDDEN {
                assert!(
                    !code.contains(word),
                    "{}:{}: the pure machine must not use `{word}`: {line}",
                    path.display(),
                    number + 1
                );
            }
        }
        checked += 1;
    }
    assert!(
        checked >= 5,
        "found only {checked} source files in {}",
        dir.display()
    );
}
