//! `airs bench decode|batch --alternate-chunks A,B`: two settings of the engine measured within
//! one run, switched before every step in the order A B B A A B B A …, their step times summed
//! per window of [`WINDOW_STEPS`] steps. `bench decode` switches the chunks of one token's
//! products and times the steps between its tokens; `bench batch` switches those of several
//! tokens' products and times the steps that decode two sequences or more and prefill nothing.
//!
//! Why: a virtual machine's host moves its vCPUs between one path to memory and two, and two
//! runs one after the other differ by up to 30 % whatever they contain (BENCHMARKS.md), so a
//! change of a few per cent cannot be seen by comparing runs. Switched step by step, both
//! settings run under every placement alike; a window's ratio compares them under one
//! placement, and its step time says which (on this machine kind, TinyLlama-1.1B Q4_K_M steps
//! of 12.5-14 ms ran under two memory paths, 18-20 ms under one). The same setting on both
//! sides gave ratios within ±1 %. The A B B A order puts each setting first after a switch as
//! often as second, so a step that pays for the previous one's state counts alike for both.
//!
//! Cost: one clock read and two relaxed stores per step; the decode figures reported beside it
//! mix the two settings.

use std::time::{Duration, Instant};

use serde_json::json;

/// Decode steps per window.
pub const WINDOW_STEPS: usize = 256;

/// A window's shortest half: a repetition's last steps count as a window of their own only if
/// each setting ran at least this many of them.
const MIN_PARTIAL_STEPS: usize = 16;

/// One window's steps and summed step times per setting (index 0: A, 1: B).
#[derive(Clone, Debug, Default)]
struct Window {
    steps: [usize; 2],
    time: [Duration; 2],
}

impl Window {
    fn ms_per_step(&self, setting: usize) -> f64 {
        self.time[setting].as_secs_f64() * 1e3 / self.steps[setting].max(1) as f64
    }

    /// B's mean step time over A's: above 1, B is slower.
    fn b_over_a(&self) -> f64 {
        self.ms_per_step(1) / self.ms_per_step(0)
    }
}

/// Sets a value of the alternated setting for the steps that follow.
pub type Apply = Box<dyn Fn(usize) + Send>;

/// The alternation of two values of one setting, applied by `apply` before each step.
pub struct Alternation {
    /// What is switched, for the report.
    pub setting: &'static str,
    values: [usize; 2],
    apply: Apply,
    /// Decode steps begun in this repetition.
    step: usize,
    /// The setting of the step under way and when it began.
    running: Option<(usize, Instant)>,
    current: Window,
    windows: Vec<Window>,
}

impl Alternation {
    /// Alternate `values` (A, B) of `setting`, which `apply` sets for the next step.
    pub fn new(setting: &'static str, values: [usize; 2], apply: Apply) -> Alternation {
        Alternation {
            setting,
            values,
            apply,
            step: 0,
            running: None,
            current: Window::default(),
            windows: Vec::new(),
        }
    }

    /// A step is about to run: it gets the setting the order gives the next counted step.
    pub fn begin_step(&mut self) {
        // A B B A: the Gray code's lowest bit.
        let setting = (self.step ^ (self.step >> 1)) & 1;
        (self.apply)(self.values[setting]);
        self.running = Some((setting, Instant::now()));
    }

    /// The step begun last ended; `counted`: it is one of the steps compared (else it is not
    /// timed, and the next step takes its place in the order).
    pub fn end_step(&mut self, counted: bool) {
        let now = Instant::now();
        if let Some((setting, began)) = self.running.take()
            && counted
        {
            self.current.steps[setting] += 1;
            self.current.time[setting] += now - began;
            self.step += 1;
            if self.current.steps.iter().sum::<usize>() == WINDOW_STEPS {
                self.windows.push(std::mem::take(&mut self.current));
            }
        }
    }

    /// A token of a lone sequence was drawn: the decode step that drew it (if one was begun)
    /// ends, and the next begins. The request's first token ends its prefill, which is not
    /// timed.
    pub fn on_token(&mut self) {
        self.end_step(true);
        self.begin_step();
    }

    /// The request ended: its last steps make a window if both settings ran enough of them,
    /// the order starts again with the next request, and A is set for the prefill.
    pub fn end_request(&mut self) {
        self.running = None;
        self.step = 0;
        let partial = std::mem::take(&mut self.current);
        if partial.steps.iter().all(|&s| s >= MIN_PARTIAL_STEPS) {
            self.windows.push(partial);
        }
        (self.apply)(self.values[0]);
    }

    /// Each window's ratio, and their median (`None` without a window).
    fn median_ratio(&self) -> Option<f64> {
        let mut ratios: Vec<f64> = self.windows.iter().map(Window::b_over_a).collect();
        (!ratios.is_empty()).then(|| crate::bench::median(&mut ratios))
    }

    pub fn json(&self) -> serde_json::Value {
        json!({
            "setting": self.setting,
            "a": self.values[0],
            "b": self.values[1],
            "window_steps": WINDOW_STEPS,
            "windows": self.windows.iter().map(|w| json!({
                "steps": w.steps,
                "a_ms_per_step": w.ms_per_step(0),
                "b_ms_per_step": w.ms_per_step(1),
                "b_over_a": w.b_over_a(),
            })).collect::<Vec<_>>(),
            "b_over_a_median": self.median_ratio(),
        })
    }

    /// The report, under the heading `what` (the steps compared); `mixed`: figures printed
    /// above it mix both settings.
    pub fn print(&self, what: &str, mixed: bool) {
        let [a, b] = self.values;
        println!(
            "  alternation, {what}: {} {a} (A) and {b} (B), switched before every step (A B B \
             A), windows of {WINDOW_STEPS} steps{}",
            self.setting,
            if mixed {
                "; the figures above mix both"
            } else {
                ""
            }
        );
        println!("    window  steps A+B  A ms/step  B ms/step     B/A");
        for (i, w) in self.windows.iter().enumerate() {
            println!(
                "    {:<7} {:>4}+{:<4} {:>10.3} {:>10.3} {:>7.4}",
                i + 1,
                w.steps[0],
                w.steps[1],
                w.ms_per_step(0),
                w.ms_per_step(1),
                w.b_over_a()
            );
        }
        match self.median_ratio() {
            Some(m) => {
                let ratios = self.windows.iter().map(Window::b_over_a);
                let lo = ratios.clone().fold(f64::INFINITY, f64::min);
                let hi = ratios.fold(f64::NEG_INFINITY, f64::max);
                println!(
                    "    B/A median {m:.4} (range {lo:.4}-{hi:.4}) over {} windows: above 1, B is \
                     slower",
                    self.windows.len()
                );
            }
            None => println!("    no window: generate more tokens (--gen-tokens)"),
        }
    }
}

/// The two counts of `--alternate-chunks`, checked.
pub fn chunk_counts(values: Option<&[usize]>) -> anyhow::Result<Option<[usize; 2]>> {
    match values {
        None => Ok(None),
        Some(&[a, b]) if a >= 1 && b >= 1 => Ok(Some([a, b])),
        Some(_) => anyhow::bail!("--alternate-chunks takes two counts of at least 1: A,B"),
    }
}

/// The two sizes of `--alternate-read-ahead`, in KiB, checked (a size beyond 1 GiB is not
/// a prefetch).
pub fn read_ahead_kib(values: Option<&[usize]>) -> anyhow::Result<Option<[usize; 2]>> {
    match values {
        None => Ok(None),
        Some(&[a, b]) if a <= 1 << 20 && b <= 1 << 20 => Ok(Some([a, b])),
        Some(_) => {
            anyhow::bail!("--alternate-read-ahead takes two sizes of at most 1 GiB in KiB: A,B")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// The values `apply` was given, in order.
    fn recorded() -> (Arc<Mutex<Vec<usize>>>, Apply) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = Arc::clone(&seen);
        (seen, Box::new(move |v| s.lock().unwrap().push(v)))
    }

    #[test]
    fn alternated_values_are_checked_before_a_run() {
        assert_eq!(chunk_counts(Some(&[2, 8])).unwrap(), Some([2, 8]));
        assert!(chunk_counts(Some(&[0, 8])).is_err());
        assert!(chunk_counts(Some(&[2])).is_err());
        assert_eq!(read_ahead_kib(Some(&[0, 512])).unwrap(), Some([0, 512]));
        assert!(read_ahead_kib(Some(&[0, (1 << 20) + 1])).is_err());
        assert!(read_ahead_kib(Some(&[0, 512, 1024])).is_err());
        assert_eq!(read_ahead_kib(None).unwrap(), None);
    }

    #[test]
    fn steps_alternate_a_b_b_a_and_fill_windows_evenly() {
        let (seen, apply) = recorded();
        let mut alt = Alternation::new("chunks", [2, 8], apply);
        for _ in 0..=2 * WINDOW_STEPS {
            alt.on_token();
        }
        let seen = seen.lock().unwrap();
        assert_eq!(&seen[..8], [2, 8, 8, 2, 2, 8, 8, 2]);
        assert_eq!(alt.windows.len(), 2);
        for w in &alt.windows {
            assert_eq!(w.steps, [WINDOW_STEPS / 2; 2]);
        }
    }

    #[test]
    fn steps_not_compared_are_not_timed_and_keep_the_order() {
        let (seen, apply) = recorded();
        let mut alt = Alternation::new("chunks", [2, 8], apply);
        // A prefill step between A and B: not counted, and B still follows A.
        for counted in [true, false, true, true, true] {
            alt.begin_step();
            alt.end_step(counted);
        }
        assert_eq!(*seen.lock().unwrap(), [2, 8, 8, 8, 2]);
        assert_eq!(alt.current.steps, [2, 2]);
    }

    #[test]
    fn a_requests_short_tail_is_dropped_and_a_is_set_for_the_next_prefill() {
        let (seen, apply) = recorded();
        let mut alt = Alternation::new("chunks", [1, 2], apply);
        // One window and 10 more steps (5 of each): too few to be a window.
        for _ in 0..=WINDOW_STEPS + 10 {
            alt.on_token();
        }
        alt.end_request();
        assert_eq!(alt.windows.len(), 1);
        assert_eq!(seen.lock().unwrap().last(), Some(&1));
        // The next request starts the order again; its 40 steps make a window.
        for _ in 0..=40 {
            alt.on_token();
        }
        alt.end_request();
        assert_eq!(alt.windows.len(), 2);
        assert_eq!(alt.windows[1].steps, [20, 20]);
        assert!(alt.median_ratio().is_some_and(f64::is_finite));
        assert_eq!(alt.json()["windows"].as_array().map(Vec::len), Some(2));
    }
}
