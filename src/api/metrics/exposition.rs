//! The two exposition formats Prometheus reads: its text format 0.0.4
//! and OpenMetrics 1.0.0, chosen by the scraper's `Accept` header. Every
//! label value goes through [`escape_label_value`], the one way a string
//! from a workload name, a node name or etcd reaches the text.

use std::fmt::Write;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4`: the default.
    Text,
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when the `Accept` header names it (Prometheus sends
    /// it first, with text/plain as a fallback) with a weight above 0,
    /// else the text format.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let asks = accept.is_some_and(|a| {
            a.split(',').any(|part| {
                let mut params = part.split(';');
                let media = params.next().unwrap_or("").trim();
                let refused = params.any(|p| {
                    p.trim()
                        .strip_prefix("q=")
                        .and_then(|q| q.trim().parse::<f64>().ok())
                        .is_some_and(|q| q <= 0.0)
                });
                media.eq_ignore_ascii_case("application/openmetrics-text") && !refused
            })
        });
        if asks { Format::OpenMetrics } else { Format::Text }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    /// Its samples are NAME_total.
    Counter,
    Gauge,
    /// Its samples are NAME_bucket (with `le`), NAME_sum and NAME_count.
    Histogram,
    /// One sample NAME_info, value 1 (a gauge in the text format).
    Info,
}

/// A metric family: the name without a type's suffix, its help and type,
/// and its sample lines as written. A sample line is the same in both
/// formats (only the HELP and TYPE lines and the end differ), so each is
/// written once, as it is added, with no structure per sample: at 5000
/// workloads those structures were most of a scrape's cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Type,
    body: String,
    samples: usize,
}

impl Family {
    pub fn new(name: &'static str, kind: Type, help: &'static str) -> Family {
        Family {
            name,
            help,
            kind,
            body: String::new(),
            samples: 0,
        }
    }

    /// A counter's, a gauge's or an info's sample.
    pub fn add(&mut self, labels: &[(&str, &str)], value: f64) {
        let suffix = match self.kind {
            Type::Counter => "_total",
            Type::Info => "_info",
            Type::Gauge | Type::Histogram => "",
        };
        self.line(suffix, labels, value);
    }

    pub fn with(mut self, labels: &[(&str, &str)], value: f64) -> Family {
        self.add(labels, value);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.samples == 0
    }

    /// NAME SUFFIX {LABELS} VALUE, each label value escaped.
    fn line(&mut self, suffix: &str, labels: &[(&str, &str)], value: f64) {
        let out = &mut self.body;
        out.push_str(self.name);
        out.push_str(suffix);
        if !labels.is_empty() {
            out.push('{');
            for (i, (name, value)) in labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(name);
                out.push_str("=\"");
                escape_label_value(value, out);
                out.push('"');
            }
            out.push('}');
        }
        out.push(' ');
        push_value(value, out);
        out.push('\n');
        self.samples += 1;
    }
}

/// A label value as both formats want it: backslash, double quote and
/// line feed escaped, nothing else changed.
pub fn escape_label_value(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// A value: integers without a fraction, the infinities and NaN as both
/// formats spell them.
fn push_value(value: f64, out: &mut String) {
    if value.is_nan() {
        out.push_str("NaN");
    } else if value.is_infinite() {
        out.push_str(if value > 0.0 { "+Inf" } else { "-Inf" });
    } else if value.fract() == 0.0 && value.abs() < 1e15 {
        let _ = write!(out, "{}", value as i64);
    } else {
        let _ = write!(out, "{value}");
    }
}

/// The families in `format`. Families with no sample are left out (a
/// TYPE line alone says nothing).
pub fn render(families: &[Family], format: Format) -> String {
    let size: usize = families
        .iter()
        .map(|f| f.body.len() + f.help.len() + 2 * f.name.len() + 40)
        .sum();
    let mut out = String::with_capacity(size + 8);
    for family in families.iter().filter(|f| !f.is_empty()) {
        // The text format names a counter and an info by their sample's
        // name; OpenMetrics by the family's.
        let (type_name, type_word) = match (format, family.kind) {
            (Format::Text, Type::Counter) => ("_total", "counter"),
            (Format::Text, Type::Info) => ("_info", "gauge"),
            (Format::OpenMetrics, Type::Counter) => ("", "counter"),
            (Format::OpenMetrics, Type::Info) => ("", "info"),
            (_, Type::Gauge) => ("", "gauge"),
            (_, Type::Histogram) => ("", "histogram"),
        };
        let _ = writeln!(out, "# HELP {}{type_name} {}", family.name, family.help);
        let _ = writeln!(out, "# TYPE {}{type_name} {type_word}", family.name);
        out.push_str(&family.body);
    }
    if format == Format::OpenMetrics {
        out.push_str("# EOF\n");
    }
    out
}

/// A histogram's cumulative buckets, count and sum.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            count: 0,
            sum: 0.0,
        }
    }

    pub fn observe(&mut self, value: f64) {
        for (bound, count) in self.bounds.iter().zip(&mut self.counts) {
            if value <= *bound {
                *count += 1;
            }
        }
        self.count += 1;
        self.sum += value;
    }

    /// Its samples, in a histogram family.
    pub fn family(&self, name: &'static str, help: &'static str) -> Family {
        let mut family = Family::new(name, Type::Histogram, help);
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            // OpenMetrics' canonical form, a float (`1.0`, not `1`), in
            // both formats, so that a bucket is one series whichever
            // format a scraper asked for.
            let mut le = String::new();
            push_value(*bound, &mut le);
            if !le.contains(['.', 'e']) {
                le.push_str(".0");
            }
            family.line("_bucket", &[("le", &le)], *count as f64);
        }
        family.line("_bucket", &[("le", "+Inf")], self.count as f64);
        family.line("_sum", &[], self.sum);
        family.line("_count", &[], self.count as f64);
        family
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_headers() {
        for (accept, want) in [
            (None, Format::Text),
            (Some("text/plain"), Format::Text),
            (Some("*/*"), Format::Text),
            // Prometheus 2.x's own header.
            (
                Some(
                    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                ),
                Format::OpenMetrics,
            ),
            (Some("Application/OpenMetrics-Text"), Format::OpenMetrics),
            (Some("application/openmetrics-textual"), Format::Text),
            (Some("application/openmetrics-text;q=0,text/plain"), Format::Text),
            (Some("application/openmetrics-text; q=0.0"), Format::Text),
            (Some("application/openmetrics-text; q=0.1"), Format::OpenMetrics),
        ] {
            assert_eq!(Format::negotiate(accept), want, "{accept:?}");
        }
    }

    #[test]
    fn label_values_are_escaped() {
        let mut out = String::new();
        escape_label_value("a\\b\"c\nd\u{e9}}{,=", &mut out);
        assert_eq!(out, "a\\\\b\\\"c\\nd\u{e9}}{,=");
    }

    #[test]
    fn values() {
        for (v, want) in [
            (1.0, "1"),
            (0.0, "0"),
            (-3.0, "-3"),
            (0.25, "0.25"),
            (1e20, "100000000000000000000"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (f64::NAN, "NaN"),
        ] {
            let mut out = String::new();
            push_value(v, &mut out);
            assert_eq!(out, want, "{v}");
        }
    }

    fn families() -> Vec<Family> {
        let mut h = Histogram::new(&[0.01, 0.1, 1.0]);
        h.observe(0.0078125);
        h.observe(0.0625);
        h.observe(3.0);
        vec![
            Family::new("berth_x_transitions", Type::Counter, "Transitions.")
                .with(&[("workload", "we\"b"), ("reason", "boot")], 2.0),
            Family::new("berth_build", Type::Info, "The build.").with(&[("version", "0.1.0")], 1.0),
            Family::new("berth_empty", Type::Gauge, "Left out."),
            Family::new("berth_up", Type::Gauge, "Up.").with(&[], 1.0),
            h.family("berth_pass_duration_seconds", "Passes."),
        ]
    }

    #[test]
    fn the_text_format() {
        assert_eq!(
            render(&families(), Format::Text),
            "# HELP berth_x_transitions_total Transitions.\n\
             # TYPE berth_x_transitions_total counter\n\
             berth_x_transitions_total{workload=\"we\\\"b\",reason=\"boot\"} 2\n\
             # HELP berth_build_info The build.\n\
             # TYPE berth_build_info gauge\n\
             berth_build_info{version=\"0.1.0\"} 1\n\
             # HELP berth_up Up.\n\
             # TYPE berth_up gauge\n\
             berth_up 1\n\
             # HELP berth_pass_duration_seconds Passes.\n\
             # TYPE berth_pass_duration_seconds histogram\n\
             berth_pass_duration_seconds_bucket{le=\"0.01\"} 1\n\
             berth_pass_duration_seconds_bucket{le=\"0.1\"} 2\n\
             berth_pass_duration_seconds_bucket{le=\"1.0\"} 2\n\
             berth_pass_duration_seconds_bucket{le=\"+Inf\"} 3\n\
             berth_pass_duration_seconds_sum 3.0703125\n\
             berth_pass_duration_seconds_count 3\n"
        );
    }

    #[test]
    fn openmetrics() {
        let text = render(&families(), Format::OpenMetrics);
        assert!(
            text.starts_with(
                "# HELP berth_x_transitions Transitions.\n\
                 # TYPE berth_x_transitions counter\n\
                 berth_x_transitions_total{workload=\"we\\\"b\",reason=\"boot\"} 2\n\
                 # HELP berth_build The build.\n\
                 # TYPE berth_build info\n\
                 berth_build_info{version=\"0.1.0\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.ends_with("berth_pass_duration_seconds_count 3\n# EOF\n"),
            "{text}"
        );
    }
}
