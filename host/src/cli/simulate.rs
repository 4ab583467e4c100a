//! `ebb simulate`: compare rules over a scenario on the real listener, in simulated time.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Args;

use crate::simulate::{self, HandlerTime, RuleChoice, Scenario, SimOptions};

/// `ebb simulate` arguments.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// A named scenario: `paper-billing` (a day busy 2 of 24 hours), `burst`, `trickle`,
    /// `idle`, `bursty-day` (a day of about 95,000 messages: quiet nights, a morning ramp, a
    /// 4 msg/s lunchtime peak, two dumps of 20,000), `knee` (a backlog of 60,000 for 2
    /// minutes: throughput and handler latency, with `--handler-knee`). Default `paper-billing` unless `--trace`
    /// is given.
    #[arg(long, conflicts_with = "trace")]
    scenario: Option<String>,
    /// The cost benchmark: every named scenario (paper-billing, burst, trickle, bursty-day,
    /// idle) for the rules (default: the backend's four, as without `--rule`), each against
    /// the floor, and the goals of the shipped defaults checked. With `--json`, the whole of
    /// every run.
    #[arg(long, conflicts_with_all = ["scenario", "trace", "duration", "chart"])]
    bench: bool,
    /// Arrivals from a CSV file: one line per arrival, `seconds[,count]` (seconds from the start).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// A rule: `fixed-1s`, `functions` (Azure Functions' trigger), `lambda-esm` (Lambda's SQS
    /// event source mapping), `paper`, `paper-push`, a rule component `FILE.wasm` (pull), or
    /// `push:FILE.wasm` (push, zero idle tasks, as `paper-push`). Repeat to compare. Default:
    /// `fixed-1s`, `paper`, `paper-push` and `functions` (on SQS `lambda-esm`).
    #[arg(long = "rule", conflicts_with = "config")]
    rules: Vec<String>,
    /// Simulate what a configured queue runs: with `--queue`, its rule file and
    /// `rule_params` (or the built-in rule), min/max tasks, intervals, batch size, push,
    /// safety poll, `max_concurrent_calls` and the `[rule_limits]`, as `ebb run` builds its
    /// listener from this file. A partitioned queue is simulated as one of its partitions.
    #[arg(long, requires = "queue", conflicts_with = "bench")]
    config: Option<PathBuf>,
    /// The configured queue to simulate (with `--config`).
    #[arg(long, requires = "config")]
    queue: Option<String>,
    /// A rule component to compare with the queue's live rule, on the queue's settings
    /// (with `--config`; repeatable); `--param` after it gives its parameters.
    #[arg(long = "candidate", value_name = "FILE.wasm", requires = "config")]
    candidates: Vec<PathBuf>,
    /// A parameter for the rule component given by the `--rule` or `--candidate` before it,
    /// as in the queue's `rule_params` (repeatable): `--rule a.wasm --param per_task=10 --rule b.wasm`.
    #[arg(long = "param", value_name = "KEY=VALUE", value_parser = super::parse_key_value)]
    params: Vec<(String, String)>,
    /// For each `--param`, the index of the `--rule` (or `--candidate`) it follows (set from
    /// the command line's positions by [`SimulateArgs::attach_params`]).
    #[arg(skip)]
    param_owners: Vec<Option<usize>>,
    /// How long to simulate (default: the scenario's own; a trace's last arrival + 10 min).
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    #[arg(long, help = handler_time_help())]
    handler_time: Option<String>,
    /// The backend modelled: `azure` (gets of 32, a delete per message; also the embedded
    /// queue's shape), `sqs` (receives of 10, delete batches of 10, long polls up to 20 s) or
    /// `sqs-fifo` (the same at FIFO's price). Default: the configured queue's with
    /// `--config`, else `azure`.
    #[arg(long, value_parser = simulate::SimBackend::parse)]
    backend: Option<simulate::SimBackend>,
    /// How many listeners the monthly cost is for (1 to 1,000,000).
    #[arg(long, default_value_t = 1)]
    listeners: u64,
    /// US dollars per 10,000 storage transactions. Default: the backend's, the paper's 0.01
    /// on Azure, SQS's 0.004 ($0.40 per million requests; FIFO 0.005).
    #[arg(long)]
    price: Option<f64>,
    /// Seed of every random choice: the same seed gives the same run (to within a few
    /// transactions: tokio picks among ready branches of a `select!` at random).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Notify the listener of every arrival (as `ebb send` and the API do), for every rule.
    #[arg(long)]
    notify: bool,
    #[arg(long, value_parser = humantime::parse_duration, help = safety_poll_help())]
    safety_poll: Option<Duration>,
    /// The floor's wait budget W (1ms to 1h): the floor is a delete per message plus the
    /// fewest gets of at most 32 that fetch every message within W of its arrival.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    wait_budget: Duration,
    /// Stop a rule's run with an error after this much real time.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    max_wall: Duration,
    /// The app slows down past this many calls at once: its latency is the handler time up
    /// to it and grows with the square of the calls beyond it (1 to 10,000). For the `knee`
    /// scenario.
    #[arg(long)]
    handler_knee: Option<u32>,
    /// The queue's `max_concurrent_calls` (1 to 10,000). Default: the queue's own, as `ebb
    /// run` has it (the host's default, or the configured queue's with `--config`); with
    /// `--bench`, every call the tasks' batches bring (`max_tasks × batch_size`, an app that
    /// scales out), as its goals are the listener's.
    #[arg(long)]
    max_concurrent_calls: Option<u32>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Include the samples over time in the JSON.
    #[arg(long, requires = "json")]
    samples: bool,
    /// Write an SVG chart of backlog, tasks and cumulative consumer calls (the floor dashed)
    /// to this file.
    #[arg(long)]
    chart: Option<PathBuf>,
}

impl SimulateArgs {
    /// Records which `--rule` each `--param` follows, from where each stands on the command line.
    pub(super) fn attach_params(&mut self, matches: &clap::ArgMatches) {
        // `--rule` and `--config` (which `--candidate` needs) exclude each other: one of the two lists is empty.
        let rules: Vec<usize> = ["rules", "candidates"].iter().flat_map(|id| matches.indices_of(id).into_iter().flatten()).collect();
        let params = matches.indices_of("params").map(Iterator::collect::<Vec<_>>).unwrap_or_default();
        self.param_owners = params.iter().map(|at| rules.iter().rposition(|rule| rule < at)).collect();
    }

    /// Each `--param` with the index of the rule (or candidate) it follows among `count`.
    fn params_per_owner(&self, count: usize, flag: &str) -> Result<Vec<Vec<(String, String)>>> {
        let mut params = vec![Vec::new(); count];
        for (index, (key, value)) in self.params.iter().enumerate() {
            // Without positions (a caller that built the arguments itself), a lone rule takes them all.
            let owner = self.param_owners.get(index).copied().unwrap_or((count == 1).then_some(0));
            let Some(owner) = owner.filter(|owner| *owner < count) else { bail!("--param {key}={value}: give it after the {flag} FILE.wasm it is for") };
            params[owner].push((key.clone(), value.clone()));
        }
        for params in &params {
            super::refuse_repeated_params(params)?;
        }
        Ok(params)
    }

    /// With `--config --queue`: the queue's live rule, then each candidate with its
    /// parameters; the queue's settings; the configuration's rule limits.
    fn configured(&self) -> Result<Option<Configured>> {
        let (Some(path), Some(name)) = (&self.config, &self.queue) else { return Ok(None) };
        let config = crate::config::Config::load(path)?;
        let queue = super::configured_queue(&config, name)?;
        if queue.partitions > 1 {
            eprintln!("note: queue {name} has {} partitions, each with its own listener: one is simulated, with the queue's settings", queue.partitions);
        }
        let live = queue.rule.as_ref().map(|file| simulate::RuleFile { path: file.in_dir(&config.rules_dir), params: queue.rule_params.clone() });
        let mut rules = vec![RuleChoice::Live(live)];
        let params = self.params_per_owner(self.candidates.len(), "--candidate")?;
        for (path, params) in self.candidates.iter().zip(params) {
            if path.extension().is_none_or(|e| e != "wasm") {
                bail!("--candidate: {} is not a rule component (FILE.wasm)", path.display());
            }
            rules.push(RuleChoice::Wasm(simulate::RuleFile { path: path.clone(), params }));
        }
        let backend = simulate::SimBackend::of_queue(queue);
        Ok(Some(Configured { rules, settings: queue.settings.clone(), limits: config.rule_limits.clone(), backend }))
    }

    /// The rules to compare, each with the parameters that follow it.
    fn rule_choices(&self, backend: simulate::SimBackend) -> Result<Vec<RuleChoice>> {
        if self.rules.is_empty() {
            if let Some((key, value)) = self.params.first() {
                bail!("--param {key}={value}: give it after the --rule FILE.wasm it is for");
            }
            return simulate::rules::defaults_for(backend).iter().map(|name| RuleChoice::parse(name)).collect();
        }
        let params = self.params_per_owner(self.rules.len(), "--rule")?;
        self.rules.iter().zip(params).map(|(text, params)| RuleChoice::parse(text)?.with_params(params)).collect()
    }
}

pub fn run(args: SimulateArgs) -> Result<()> {
    let options = args.options()?;
    if args.bench {
        return args.print_bench(&options);
    }
    args.print_run(&options)
}

impl SimulateArgs {
    /// What to simulate, every flag checked before the run.
    fn options(&self) -> Result<SimOptions> {
        let scenario = match (&self.scenario, &self.trace) {
            (_, Some(path)) => Scenario::Trace(path.clone()),
            (Some(name), None) => Scenario::named(name)?,
            (None, None) => Scenario::PaperBilling,
        };
        let (rules, queue_settings, rule_limits, backend) = match self.configured()? {
            Some(Configured { rules, settings, limits, backend }) => (rules, Some(settings), Some(limits), self.backend.unwrap_or(backend)),
            None => {
                let backend = self.backend.unwrap_or_default();
                (self.rule_choices(backend)?, None, None, backend)
            }
        };
        if let Some(chart) = &self.chart {
            check_chart(chart)?;
        }
        let workload = if self.bench {
            // Replaced by each scenario's own; the settings below are checked once, up front.
            Scenario::Idle.workload(Some(Duration::from_secs(1)), self.seed)?
        } else {
            scenario.workload(self.duration, self.seed)?
        };
        Ok(SimOptions {
            workload,
            rules,
            handler_time: self.handler_time.as_deref().map_or(Ok(simulate::DEFAULT_HANDLER_TIME), HandlerTime::parse)?,
            listeners: self.listeners,
            backend,
            price_per_10k: self.price.unwrap_or_else(|| backend.default_price_per_10k()),
            seed: self.seed,
            notify: self.notify,
            max_wall: self.max_wall,
            safety_poll: self.safety_poll,
            wait_budget: self.wait_budget,
            handler_knee: self.handler_knee,
            max_concurrent_calls: self.max_concurrent_calls,
            queue_settings,
            rule_limits,
            rule_cache: super::rule::user_rule_cache(),
        })
    }

    /// `--bench`: every scenario, as a table or JSON.
    fn print_bench(&self, options: &SimOptions) -> Result<()> {
        let mut report = simulate::bench::run(options)?;
        if self.json {
            for scenario in &mut report.scenarios {
                for rule in &mut scenario.rules {
                    if !self.samples {
                        rule.samples.clear();
                    }
                }
            }
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", simulate::bench::table(&report));
        }
        Ok(())
    }

    /// One scenario, as a table or JSON, and the chart when asked.
    fn print_run(&self, options: &SimOptions) -> Result<()> {
        let mut report = simulate::run(options)?;
        if let Some(chart) = &self.chart {
            simulate::chart::write_svg(&report, chart)?;
        }
        if self.json {
            if !self.samples {
                for rule in &mut report.rules {
                    rule.samples.clear();
                }
            }
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", simulate::report::table(&report));
            if let Some(chart) = &self.chart {
                println!("chart: {}", chart.display());
            }
        }
        Ok(())
    }
}

/// What `--config --queue` gives a simulation.
struct Configured {
    /// The queue's live rule, then each candidate.
    rules: Vec<RuleChoice>,
    /// The queue's listener settings.
    settings: crate::listener::QueueSettings,
    /// The configuration's rule limits.
    limits: crate::rules::RuleLimits,
    /// The queue's backend.
    backend: simulate::SimBackend,
}

/// Refuses a `--chart` path that cannot take the chart. Found before the run, not after it:
/// such a path would throw the finished run away (and a FIFO there would hang the write).
fn check_chart(chart: &Path) -> Result<()> {
    if chart.extension().is_none_or(|e| e != "svg") {
        bail!("--chart: {} must end in .svg (the chart is SVG)", chart.display());
    }
    if std::fs::metadata(chart).is_ok_and(|meta| !meta.is_file()) {
        bail!("--chart: {} is not a regular file", chart.display());
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(chart)
        .map_err(|e| anyhow::anyhow!("--chart: cannot write {}: {e}", chart.display()))?;
    Ok(())
}

/// `--safety-poll`'s help, with the default the config uses.
fn safety_poll_help() -> String {
    format!(
        "The safety poll of push rules (1s to {}; default {}, the config's default)",
        crate::durations::show(crate::config::MAX_SAFETY_POLL),
        crate::durations::show(crate::defaults::SAFETY_POLL)
    )
}

/// `--handler-time`'s help, with the default the simulator uses.
fn handler_time_help() -> String {
    format!(
        "Handler time per message: `20ms` (fixed), `10ms..200ms` (uniform), `exp:50ms` (exponential with that mean); default {}, whose calls end staggered as a real app's do",
        simulate::DEFAULT_HANDLER_TIME
    )
}
