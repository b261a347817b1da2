//! `siesta bench resume --concurrency N`: rounds of N sandboxes resumed
//! from a template at once, against the same number of resumes one at a
//! time, in one run. Each resume counts from the create call to the
//! sandbox's ready agent (wall time), so waiting for the CPU, the pool and
//! locks is included.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use serde_json::json;
use siesta_sandbox::SandboxManager;

use super::session::create_pooled;
use crate::stats::{percentile, summarize};

/// What a run measured, in milliseconds.
pub struct Concurrent {
    pub n: usize,
    pub single: Vec<f64>,
    pub concurrent: Vec<f64>,
}

/// `rounds` single resumes, then `rounds` rounds of `n` at once.
pub async fn measure(
    manager: &Arc<SandboxManager>,
    template: &str,
    n: usize,
    rounds: usize,
) -> anyhow::Result<Concurrent> {
    let mut out = Concurrent {
        n,
        single: Vec::with_capacity(rounds),
        concurrent: Vec::with_capacity(rounds * n),
    };
    for i in 0..rounds {
        let ms = timed_create(manager, template)
            .await
            .with_context(|| format!("single resume {} of {rounds}", i + 1))?;
        out.single.push(ms);
    }
    for round in 0..rounds {
        let all = (0..n).map(|_| timed_create(manager, template));
        for (i, r) in futures::future::join_all(all).await.into_iter().enumerate() {
            let ms = r.with_context(|| format!("round {}: resume {} of {n}", round + 1, i + 1))?;
            out.concurrent.push(ms);
        }
    }
    Ok(out)
}

/// One create, timed, then killed.
async fn timed_create(manager: &Arc<SandboxManager>, template: &str) -> anyhow::Result<f64> {
    let started = Instant::now();
    let info = create_pooled(manager, template).await?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    manager.kill(&info.id).await?;
    Ok(ms)
}

pub fn report(m: &Concurrent, template: &str, as_json: bool) {
    let single = summarize(&m.single);
    let conc = summarize(&m.concurrent);
    let p99 = percentile(&m.concurrent, 0.99);
    if as_json {
        let out = json!({
            "concurrency": m.n,
            "single_p50_ms": single.p50,
            "concurrent_p50_ms": conc.p50,
            "concurrent_p99_ms": p99,
            "concurrent_samples": conc.n,
            "single_samples": single.n,
            "p99_over_single_p50": p99 / single.p50,
        });
        println!("{out}");
        return;
    }
    println!(
        "siesta bench resume --concurrency {}: template {template}, {} resumes one at a time, then {} rounds of {} at once (wall time from create to a ready agent)\n",
        m.n, single.n, single.n, m.n
    );
    println!("| Resumes | Samples | p50 | p99 | Max |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    println!(
        "| one at a time | {} | {:.1} ms | {:.1} ms | {:.1} ms |",
        single.n,
        single.p50,
        percentile(&m.single, 0.99),
        single.max
    );
    println!(
        "| {} at once | {} | {:.1} ms | {:.1} ms | {:.1} ms |",
        m.n, conc.n, conc.p50, p99, conc.max
    );
    println!(
        "\np99 at {} at once / single p50: {:.2}",
        m.n,
        p99 / single.p50
    );
}
