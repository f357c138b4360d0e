//! What a run leaves behind: `results.json`, `latency.svg` (every client operation's latency
//! over time, by outcome, with the fault windows shaded; drawn by hand, no plotting crate),
//! and the one-screen summary on stdout. What must never live here: judging (that is
//! `checkers/`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::{json, Value};

use crate::checkers::{Named, Verdict};
use crate::history::{pairs, Op, OpType, NEMESIS};

/// A fault window: `(fault, from ns, to ns)`.
pub type Window = (String, u64, u64);

/// The fault windows of a history: each `start` closed by the next `stop` of that fault (or
/// the end of the run).
pub fn fault_windows(history: &[Op]) -> Vec<Window> {
    let end = history.last().map_or(0, |op| op.time_ns);
    let mut open: BTreeMap<String, u64> = BTreeMap::new();
    let mut windows = Vec::new();
    for op in history.iter().filter(|op| op.is_named(NEMESIS)) {
        let fault = op.value["fault"].as_str().unwrap_or("").to_owned();
        match op.f.as_str() {
            "start" => {
                open.insert(fault, op.time_ns);
            }
            "stop" => {
                if let Some(from) = open.remove(&fault) {
                    windows.push((fault, from, op.time_ns));
                }
            }
            _ => {}
        }
    }
    windows.extend(open.into_iter().map(|(fault, from)| (fault, from, end)));
    windows.sort_by_key(|window| window.1);
    windows
}

/// Counts of client operations by function and outcome.
pub fn operation_counts(history: &[Op]) -> BTreeMap<String, BTreeMap<&'static str, u64>> {
    let mut counts: BTreeMap<String, BTreeMap<&'static str, u64>> = BTreeMap::new();
    for pair in pairs(history) {
        let outcome = match pair.outcome() {
            OpType::Ok => "ok",
            OpType::Fail => "fail",
            _ => "info",
        };
        *counts
            .entry(pair.invoke.f.clone())
            .or_default()
            .entry(outcome)
            .or_default() += 1;
    }
    counts
}

/// Writes `results.json`; returns the JSON written.
pub fn write_results(
    path: &Path,
    verdict: Verdict,
    results: &[Named],
    run: Value,
) -> anyhow::Result<Value> {
    let checkers: serde_json::Map<String, Value> = results
        .iter()
        .map(|result| {
            (
                result.name.to_owned(),
                serde_json::to_value(result).unwrap_or(Value::Null),
            )
        })
        .collect();
    let document = json!({"valid": verdict.to_json(), "checkers": checkers, "run": run});
    std::fs::write(path, serde_json::to_string_pretty(&document)?)?;
    Ok(document)
}

/// Writes the latency plot.
pub fn write_latency_svg(path: &Path, history: &[Op], title: &str) -> anyhow::Result<()> {
    const WIDTH: f64 = 1000.0;
    const HEIGHT: f64 = 420.0;
    const LEFT: f64 = 60.0;
    const RIGHT: f64 = 20.0;
    const TOP: f64 = 30.0;
    const BOTTOM: f64 = 40.0;
    let plot_width = WIDTH - LEFT - RIGHT;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let end_s = history
        .last()
        .map_or(1.0, |op| op.time_ns as f64 / 1e9)
        .max(1.0);
    // Latency on a log scale from 0.1 ms to 10 s.
    let (low, high) = (-1.0f64, 4.0f64);
    let x = |seconds: f64| LEFT + seconds / end_s * plot_width;
    let y = |latency_ms: f64| {
        let clamped = latency_ms.max(0.1).log10().clamp(low, high);
        TOP + (high - clamped) / (high - low) * plot_height
    };
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        svg,
        r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    let _ = write!(
        svg,
        r#"<text x="{LEFT}" y="18" font-size="13">{}</text>"#,
        escape(title)
    );
    let colors: BTreeMap<&str, &str> = BTreeMap::from([
        ("kill", "#f4a6a6"),
        ("pause", "#a6c8f4"),
        ("partition", "#f4d9a6"),
        ("clock", "#c6f4a6"),
        ("clock-beyond", "#e0a6f4"),
        ("membership", "#a6f4ec"),
    ]);
    for (fault, from, to) in fault_windows(history) {
        let left = x(from as f64 / 1e9);
        let width = (x(to as f64 / 1e9) - left).max(1.0);
        let color = colors.get(fault.as_str()).copied().unwrap_or("#dddddd");
        let _ = write!(
            svg,
            r#"<rect x="{left:.1}" y="{TOP}" width="{width:.1}" height="{plot_height}" fill="{color}" fill-opacity="0.5"><title>{}</title></rect>"#,
            escape(&fault)
        );
    }
    for exponent in -1..=4 {
        let latency = 10f64.powi(exponent);
        let line_y = y(latency);
        let label = if latency < 1.0 {
            "0.1 ms".to_owned()
        } else if latency < 1000.0 {
            format!("{latency} ms")
        } else {
            format!("{} s", latency / 1000.0)
        };
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" x2="{}" y1="{line_y:.1}" y2="{line_y:.1}" stroke="#eeeeee"/>"##,
            WIDTH - RIGHT
        );
        let _ = write!(svg, r#"<text x="4" y="{:.1}">{label}</text>"#, line_y + 4.0);
    }
    let ticks = 10;
    for tick in 0..=ticks {
        let seconds = end_s * f64::from(tick) / f64::from(ticks);
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{seconds:.0} s</text>"#,
            x(seconds),
            HEIGHT - BOTTOM + 16.0
        );
    }
    for pair in pairs(history) {
        let Some(complete) = pair.complete else {
            continue;
        };
        let latency_ms = (complete.time_ns.saturating_sub(pair.invoke.time_ns)) as f64 / 1e6;
        let color = match complete.kind {
            OpType::Ok => "#2a8a2a",
            OpType::Fail => "#d08000",
            _ => "#c00000",
        };
        let _ = write!(
            svg,
            r#"<circle cx="{:.1}" cy="{:.1}" r="1.6" fill="{color}" fill-opacity="0.6"/>"#,
            x(pair.invoke.time_ns as f64 / 1e9),
            y(latency_ms)
        );
    }
    let legend = [("#2a8a2a", "ok"), ("#d08000", "fail"), ("#c00000", "info")];
    for (position, (color, label)) in legend.iter().enumerate() {
        let legend_x = WIDTH - RIGHT - 260.0 + position as f64 * 50.0;
        let _ = write!(
            svg,
            r#"<circle cx="{legend_x}" cy="14" r="4" fill="{color}"/><text x="{}" y="18">{label}</text>"#,
            legend_x + 7.0
        );
    }
    let _ = write!(
        svg,
        r#"<text x="{}" y="18">shaded: faults</text>"#,
        WIDTH - RIGHT - 100.0
    );
    let _ = write!(
        svg,
        r#"<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{}" stroke="black"/>"#,
        HEIGHT - BOTTOM
    );
    let _ = write!(
        svg,
        r#"<line x1="{LEFT}" x2="{}" y1="{}" y2="{}" stroke="black"/>"#,
        WIDTH - RIGHT,
        HEIGHT - BOTTOM,
        HEIGHT - BOTTOM
    );
    svg.push_str("</svg>\n");
    std::fs::write(path, svg)?;
    Ok(())
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The one-screen summary.
pub fn summary(verdict: Verdict, results: &[Named], run: &Value, history: &[Op]) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "baton-jepsen: workload {} nemesis {} seed {} time limit {} s, concurrency {}",
        run["workload"].as_str().unwrap_or(""),
        run["nemesis"],
        run["seed"],
        run["time_limit_s"],
        run["concurrency"]
    );
    let _ = writeln!(text, "run dir: {}", run["out"].as_str().unwrap_or(""));
    if let Some(network) = run["network"].as_str() {
        let _ = writeln!(
            text,
            "network: {network} ({})",
            run["network_selection"].as_str().unwrap_or("")
        );
    }
    let counts = operation_counts(history);
    let mut line = String::from("operations:");
    for (f, outcomes) in &counts {
        let _ = write!(
            line,
            " {f} {}/{}/{}",
            outcomes.get("ok").unwrap_or(&0),
            outcomes.get("fail").unwrap_or(&0),
            outcomes.get("info").unwrap_or(&0)
        );
    }
    let _ = writeln!(text, "{line}   (ok/fail/info)");
    let _ = writeln!(text, "faults injected: {}", run["faults"]);
    for result in results {
        let mark = match result.verdict {
            Verdict::Valid => "valid  ",
            Verdict::Invalid => "INVALID",
            Verdict::Unknown => "unknown",
        };
        let counted = if result.counted {
            ""
        } else {
            " (reported, not counted)"
        };
        let _ = writeln!(
            text,
            "  {mark} {:<24} {:>8.1} ms  {}{counted}",
            result.name, result.elapsed_ms, result.summary
        );
    }
    let _ = writeln!(
        text,
        "verdict: {}",
        match verdict {
            Verdict::Valid => "VALID",
            Verdict::Invalid => "INVALID",
            Verdict::Unknown => "UNKNOWN",
        }
    );
    text
}
