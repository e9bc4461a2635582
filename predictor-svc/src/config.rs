//! predictor-svc configuration (TOML).
//!
//! ```toml
//! listen = "127.0.0.1:9000"
//! [[pool]]
//! name = "default"
//! endpoints = ["127.0.0.1:8001", "127.0.0.1:8002"]
//! ```

use std::net::SocketAddr;
use std::path::Path;

use serde::Deserialize;

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address the HTTP API listens on.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// How often each endpoint's `/metrics` is scraped.
    #[serde(default = "default_scrape_interval_ms")]
    pub scrape_interval_ms: u64,
    /// A scrape slower than this counts as failed.
    #[serde(default = "default_scrape_timeout_ms")]
    pub scrape_timeout_ms: u64,
    /// Metrics older than this make an endpoint's predictions unknown.
    #[serde(default = "default_stale_after_ms")]
    pub stale_after_ms: u64,
    /// A dispatched request never reported is forgotten after this long.
    #[serde(default = "default_in_flight_ttl_s")]
    pub in_flight_ttl_s: u64,
    /// Prefix blocks remembered per endpoint (LRU).
    #[serde(default = "default_prefix_blocks")]
    pub prefix_blocks_per_endpoint: usize,
    /// Observations kept in memory for `GET /v1/observations`.
    #[serde(default = "default_observations_kept")]
    pub observations_kept: usize,
    #[serde(rename = "pool")]
    pub pools: Vec<PoolConfig>,
}

/// One pool of interchangeable model servers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    /// `ip:port` of each model server (static list).
    pub endpoints: Vec<String>,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9000))
}
fn default_scrape_interval_ms() -> u64 {
    200
}
fn default_scrape_timeout_ms() -> u64 {
    1000
}
fn default_stale_after_ms() -> u64 {
    5000
}
fn default_in_flight_ttl_s() -> u64 {
    600
}
fn default_prefix_blocks() -> usize {
    100_000
}
fn default_observations_kept() -> usize {
    10_000
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        Config::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// Parses and validates config text.
    pub fn parse(text: &str) -> anyhow::Result<Config> {
        let config: Config = toml::from_str(text)?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(!self.pools.is_empty(), "at least one [[pool]] is required");
        anyhow::ensure!(self.scrape_interval_ms >= 10, "scrape_interval_ms must be >= 10");
        anyhow::ensure!(self.scrape_timeout_ms >= 10, "scrape_timeout_ms must be >= 10");
        let mut names = std::collections::HashSet::new();
        for pool in &self.pools {
            anyhow::ensure!(!pool.name.is_empty(), "pool.name must not be empty");
            anyhow::ensure!(names.insert(&pool.name), "pool {:?} is defined twice", pool.name);
            anyhow::ensure!(!pool.endpoints.is_empty(), "pool {:?}: endpoints must not be empty", pool.name);
            for e in &pool.endpoints {
                e.parse::<SocketAddr>()
                    .map_err(|_| anyhow::anyhow!("pool {:?}: endpoint {e:?} is not ip:port", pool.name))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_config() {
        let c = Config::parse("[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\n").unwrap();
        assert_eq!(c.pools[0].endpoints.len(), 1);
        assert_eq!(c.scrape_interval_ms, 200);
    }

    #[test]
    fn invalid_configs_refused() {
        for text in [
            "",
            "[[pool]]\nname = \"p\"\nendpoints = []\n",
            "[[pool]]\nname = \"p\"\nendpoints = [\"localhost\"]\n",
            "[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\n[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:2\"]\n",
            "bogus = 1\n[[pool]]\nname = \"p\"\nendpoints = [\"127.0.0.1:1\"]\n",
        ] {
            assert!(Config::parse(text).is_err(), "{text}");
        }
    }
}
