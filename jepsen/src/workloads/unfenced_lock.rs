//! The `unfenced-lock` workload: the known-unsafe design. Holders use leases exactly as in the
//! `lease` workload, but the resource they guard does not check fences, and under the `pause`
//! nemesis a holder stalls between checking that its lease is valid and writing, for longer
//! than the TTL (the classic GC pause). Its late write lands while another holder holds the
//! lease, and the checkers must say so: a harness that cannot catch this cannot be trusted to
//! call Baton safe. What must never live here: a fence check.

use super::{lease, Context};

/// Runs the workload; `ctx.resource` must be a resource made without fence checks.
pub async fn run(ctx: Context, concurrency: usize) {
    lease::run(ctx, concurrency, true, lease::TREE).await;
}
