//! The `auto[:TARGET][,max=SIZE][,min=SIZE][,step=PCT][,interval=DURATION]`
//! of `uswap run --budget` and `uswap bench program --auto`: a budget that
//! finds itself, and how its controller (`uswap::domain::auto`) moves.

use anyhow::{bail, Context};
use uswap::domain::auto::Tuning;

/// What `--budget auto...` asked for: the tuning, and the budget to start
/// from (`max=`, else the default share of memory).
pub struct AutoSpec {
    pub tuning: Tuning,
    pub start: Option<u64>,
}

/// Parse `auto[:TARGET][,max=SIZE][,min=SIZE][,step=PCT][,interval=DURATION]`;
/// None when `s` is not an auto budget.  TARGET is a stall share (`0.2%`),
/// PCT the largest step down (`10%`), DURATION how often it decides
/// (`1s`, `500ms`).
pub fn parse(s: &str) -> anyhow::Result<Option<AutoSpec>> {
    let Some(rest) = s.strip_prefix("auto") else {
        return Ok(None);
    };
    let page = uswap::PAGE_SIZE as u64;
    let mut tuning = Tuning::default();
    let mut start = None;
    let mut parts = rest.split(',');
    let head = parts.next().unwrap_or("");
    if let Some(t) = head.strip_prefix(':') {
        let pct: f64 = t
            .strip_suffix('%')
            .and_then(|p| p.trim().parse().ok())
            .filter(|p: &f64| *p > 0.0 && *p < 100.0)
            .with_context(|| format!("--budget {s}: the target is a stall share such as 0.2%"))?;
        tuning.target = pct / 100.0;
    } else if !head.is_empty() {
        bail!("--budget {s}: auto, auto:TARGET, then ,max=SIZE ,min=SIZE ,step=PCT ,interval=DURATION (e.g. auto:0.2%,max=4G)");
    }
    for p in parts {
        let (k, v) = p.split_once('=').with_context(|| {
            format!("--budget {s}: {p:?} is not max=SIZE, min=SIZE, step=PCT or interval=DURATION")
        })?;
        let bytes = || crate::parse_bytes(v).map_err(|e| anyhow::anyhow!("--budget {s}: {v}: {e}"));
        match k {
            "max" => {
                let bytes = bytes()?;
                tuning.max = bytes / page;
                start = Some(bytes);
            }
            "min" => tuning.min = (bytes()? / page).max(1),
            "step" => {
                tuning.max_probe = v
                    .strip_suffix('%')
                    .and_then(|p| p.trim().parse::<f64>().ok())
                    .filter(|p| *p > 0.0 && *p < 100.0)
                    .with_context(|| format!("--budget {s}: step= is a share of the budget such as 10%"))?
                    / 100.0;
            }
            "interval" => {
                tuning.interval = parse_duration(v)
                    .filter(|d| *d >= std::time::Duration::from_millis(100))
                    .with_context(|| {
                        format!("--budget {s}: interval= is a duration of 100ms or more, such as 1s")
                    })?;
            }
            _ => bail!("--budget {s}: {k}= is not max=, min=, step= or interval="),
        }
    }
    if tuning.min > tuning.max {
        bail!("--budget {s}: min= is above max=");
    }
    Ok(Some(AutoSpec { tuning, start }))
}

/// `1s`, `500ms`, `2.5s`.
fn parse_duration(v: &str) -> Option<std::time::Duration> {
    let (n, unit) = match v.strip_suffix("ms") {
        Some(n) => (n, 1e-3),
        None => (v.strip_suffix('s')?, 1.0),
    };
    let secs = n
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x > 0.0)?
        * unit;
    Some(std::time::Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_budgets_parse_and_bad_ones_say_why() {
        assert!(parse("1G").unwrap().is_none());
        let a = parse("auto").unwrap().unwrap();
        assert_eq!(a.tuning, Tuning::default());
        assert!(a.start.is_none());
        let a = parse("auto:0.5%,max=4G,min=256M,step=20%,interval=500ms")
            .unwrap()
            .unwrap();
        assert_eq!(a.tuning.target, 0.005);
        assert_eq!(a.tuning.max_probe, 0.2);
        assert_eq!(a.tuning.interval, std::time::Duration::from_millis(500));
        assert_eq!(
            parse("auto,interval=2s").unwrap().unwrap().tuning.interval,
            std::time::Duration::from_secs(2)
        );
        assert_eq!(a.tuning.max, (4u64 << 30) / uswap::PAGE_SIZE as u64);
        assert_eq!(a.tuning.min, (256u64 << 20) / uswap::PAGE_SIZE as u64);
        assert_eq!(a.start, Some(4 << 30));
        for (bad, why) in [
            ("auto:fast", "a stall share such as 0.2%"),
            ("autox", "auto, auto:TARGET"),
            ("auto,max=lots", "lots"),
            ("auto,size=1G", "size= is not"),
            ("auto,step=2", "step= is a share"),
            ("auto,step=100%", "step= is a share"),
            ("auto,interval=10ms", "interval= is a duration"),
            ("auto,interval=fast", "interval= is a duration"),
            ("auto,max=1G,min=2G", "min= is above max="),
        ] {
            let e = parse(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
