//! The one integration test binary (STYLE rule 12). Tests that start real `batond` processes
//! arrive with the server; until then this checks that the workspace's crates link together.

#[test]
fn the_state_machine_links_into_the_integration_tests() {
    let machine = baton_raft_store::machine::Machine::default();
    assert_eq!(machine.fence_counter(), 0);
    machine
        .check_invariants()
        .expect("a new machine is consistent");
}
