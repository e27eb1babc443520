//! Many pods through their whole life (run → status → stop → remove), P at a time, with the
//! latency of each CRI step: the parallel leak test and the `RunPodSandbox` benchmark share it.

use crate::client::{Cri, CriError};
use crate::spec::PodSpec;
use std::time::Instant;

/// One pod's life, timed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Lap {
    /// Sandbox id.
    pub id: String,
    /// Pod name.
    pub name: String,
    /// The IP the runtime reported.
    pub ip: String,
    /// `RunPodSandbox`, ms.
    pub run_ms: f64,
    /// `StopPodSandbox`, ms.
    pub stop_ms: f64,
    /// `RemovePodSandbox`, ms.
    pub remove_ms: f64,
}

/// What a cycle returns: every lap, and the first errors.
#[derive(Debug, serde::Serialize)]
pub struct Report {
    /// Pods that went through every step.
    pub laps: Vec<Lap>,
    /// Pods that failed somewhere, with why.
    pub errors: Vec<String>,
    /// Median `RunPodSandbox`, ms.
    pub run_median_ms: f64,
    /// Median Stop+Remove, ms.
    pub stop_remove_median_ms: f64,
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

async fn one(mut cri: Cri, spec: PodSpec) -> Result<Lap, CriError> {
    let t = Instant::now();
    let id = cri.run(spec.config()).await?;
    let run_ms = ms(t);
    let ip = cri.status(&id).await?.ip;
    let t = Instant::now();
    cri.stop(&id).await?;
    let stop_ms = ms(t);
    let t = Instant::now();
    cri.remove(&id).await?;
    Ok(Lap {
        id,
        name: spec.name,
        ip,
        run_ms,
        stop_ms,
        remove_ms: ms(t),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let upper = v.get(n / 2).copied().unwrap_or_default();
    if n % 2 == 1 {
        upper
    } else {
        let lower = v.get(n / 2 - 1).copied().unwrap_or(upper);
        f64::midpoint(lower, upper)
    }
}

/// Runs `count` pods named `<prefix>-<i>`, `parallel` at a time. A pod whose IP comes back empty
/// counts as an error: with CNI, a ready sandbox always has one.
pub async fn cycle(cri: &Cri, template: &PodSpec, count: usize, parallel: usize) -> Report {
    let mut laps = Vec::new();
    let mut errors = Vec::new();
    let names: Vec<String> = (0..count)
        .map(|i| format!("{}-{i}", template.name))
        .collect();
    for chunk in names.chunks(parallel.max(1)) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|name| {
                let spec = PodSpec {
                    name: name.clone(),
                    ..template.clone()
                };
                tokio::spawn(one(cri.clone(), spec))
            })
            .collect();
        for (name, task) in chunk.iter().zip(tasks) {
            match task.await {
                Ok(Ok(lap)) if lap.ip.is_empty() => errors.push(format!("{name}: no IP")),
                Ok(Ok(lap)) => laps.push(lap),
                Ok(Err(e)) => errors.push(format!("{name}: {e}")),
                Err(e) => errors.push(format!("{name}: task failed: {e}")),
            }
        }
    }
    Report {
        run_median_ms: median(laps.iter().map(|l| l.run_ms).collect()),
        stop_remove_median_ms: median(laps.iter().map(|l| l.stop_ms + l.remove_ms).collect()),
        laps,
        errors,
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn medians() {
        assert!((median(vec![3.0, 1.0, 2.0]) - 2.0).abs() < 1e-9);
        assert!((median(vec![4.0, 1.0, 2.0, 3.0]) - 2.5).abs() < 1e-9);
        assert!(median(Vec::new()).abs() < 1e-9);
    }
}
