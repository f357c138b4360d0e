//! What a workload leaves behind: its figures as JSON, and a bar chart of the headline figure
//! as a self-contained SVG (no script, no external font), for the notes and docs.

use std::path::Path;

/// One workload's figures.
#[derive(Debug)]
pub struct Figures {
    /// Everything measured, written as `W.json`.
    pub json: serde_json::Value,
    /// The headline figure, drawn as `W.svg`.
    pub chart: Chart,
}

/// A bar chart: one bar per label, all in one unit.
#[derive(Debug)]
pub struct Chart {
    pub title: String,
    /// What the values are, under the chart (e.g. "cycles/s", "ms").
    pub unit: String,
    pub bars: Vec<(String, f64)>,
}

impl Figures {
    /// Writes `W.json` and `W.svg` into `dir`.
    pub fn write(&self, dir: &Path, workload: &str) -> anyhow::Result<()> {
        std::fs::write(
            dir.join(format!("{workload}.json")),
            serde_json::to_string_pretty(&self.json)? + "\n",
        )?;
        std::fs::write(dir.join(format!("{workload}.svg")), self.chart.svg())?;
        Ok(())
    }
}

const WIDTH: f64 = 640.0;
const BAR_AREA_TOP: f64 = 40.0;
const BAR_AREA_HEIGHT: f64 = 220.0;
const LABEL_HEIGHT: f64 = 50.0;

impl Chart {
    /// The chart as SVG text. Bars scale to the largest value; a value that is not finite
    /// (a percentile of nothing) draws no bar and is labelled "n/a".
    pub fn svg(&self) -> String {
        let largest = self
            .bars
            .iter()
            .map(|(_, value)| *value)
            .filter(|value| value.is_finite())
            .fold(0.0_f64, f64::max);
        let slot = WIDTH / self.bars.len().max(1) as f64;
        let bar_width = (slot * 0.6).max(1.0);
        let height = BAR_AREA_TOP + BAR_AREA_HEIGHT + LABEL_HEIGHT;
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
             font-family=\"sans-serif\" font-size=\"12\">\n\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
             <text x=\"{}\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">{}</text>\n",
            WIDTH / 2.0,
            escape(&self.title)
        );
        let baseline = BAR_AREA_TOP + BAR_AREA_HEIGHT;
        for (index, (label, value)) in self.bars.iter().enumerate() {
            let center = slot * (index as f64 + 0.5);
            let shown = if value.is_finite() {
                let bar = if largest > 0.0 {
                    value.max(0.0) / largest * BAR_AREA_HEIGHT
                } else {
                    0.0
                };
                svg += &format!(
                    "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{bar_width:.1}\" height=\"{bar:.1}\" fill=\"#4a7ab5\"/>\n",
                    center - bar_width / 2.0,
                    baseline - bar
                );
                format_value(*value)
            } else {
                "n/a".to_owned()
            };
            svg += &format!(
                "<text x=\"{center:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n\
                 <text x=\"{center:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
                baseline + 16.0,
                escape(label),
                baseline + 32.0,
                escape(&shown)
            );
        }
        svg += &format!(
            "<line x1=\"0\" y1=\"{baseline}\" x2=\"{WIDTH}\" y2=\"{baseline}\" stroke=\"black\"/>\n\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#555\">{}</text>\n</svg>\n",
            WIDTH / 2.0,
            height - 4.0,
            escape(&self.unit)
        );
        svg
    }
}

/// Whole numbers from 100, one decimal from 10, two below: 2918, 16.9, 0.51.
fn format_value(value: f64) -> String {
    if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_largest_and_text_is_escaped() {
        let chart = Chart {
            title: "cycles <per> second".to_owned(),
            unit: "cycles/s".to_owned(),
            bars: vec![
                ("1".to_owned(), 100.0),
                ("64".to_owned(), 400.0),
                ("none".to_owned(), f64::NAN),
            ],
        };
        let svg = chart.svg();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("cycles &lt;per&gt; second"));
        let full = format!("height=\"{BAR_AREA_HEIGHT:.1}\"");
        let quarter = format!("height=\"{:.1}\"", BAR_AREA_HEIGHT / 4.0);
        assert!(svg.contains(&full), "the largest bar fills the area: {svg}");
        assert!(
            svg.contains(&quarter),
            "a quarter of it is a quarter: {svg}"
        );
        assert!(svg.contains(">n/a<"));
        assert_eq!(svg.matches("<rect x=").count(), 2, "no bar for NaN");
    }

    #[test]
    fn values_keep_three_figures() {
        assert_eq!(format_value(2918.4), "2918");
        assert_eq!(format_value(16.94), "16.9");
        assert_eq!(format_value(0.5123), "0.51");
    }
}
