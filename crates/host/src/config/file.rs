//! The configuration file, `siesta.toml`: every node setting that the
//! environment can also set, plus the server's own (`[server]`).
//!
//! Where: `$SIESTA_CONFIG` if set (then it must exist), else
//! `$SIESTA_HOME/siesta.toml` if it exists. Precedence, lowest first:
//! built-in defaults, the file, environment variables, command-line flags.
//! An unknown key is an error that names it, so a typo never silently
//! leaves a default in force.
//!
//! ```toml
//! [node]
//! vcpus = 2
//! memory_mib = 1024
//! pool_size = 2
//! max_slots = 32
//! resume_ready_timeout_secs = 30
//!
//! [server]
//! listen = "0.0.0.0:3000"
//! log_format = "json"
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::config::NodeConfig;

/// File name in the data directory.
pub const FILE_NAME: &str = "siesta.toml";

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub node: NodeSection,
    #[serde(default)]
    pub server: ServerSection,
}

/// `[node]`: what [`NodeConfig`] holds (names as its fields; timeouts in
/// seconds). Each has the environment variable of docs/configuration.md.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSection {
    pub qemu: Option<PathBuf>,
    pub accel: Option<String>,
    pub vcpus: Option<u32>,
    pub memory_mib: Option<u32>,
    pub pool_size: Option<usize>,
    pub warm_slots: Option<usize>,
    pub max_slots: Option<usize>,
    pub net_tag: Option<String>,
    pub net_subnet: Option<String>,
    pub kernel_args: Option<String>,
    pub resume_ready_timeout_secs: Option<u64>,
    pub boot_ready_timeout_secs: Option<u64>,
    pub record_manifest: Option<bool>,
    pub prefetch: Option<bool>,
    pub prefetch_pad_kib: Option<u64>,
    pub prealloc_memory: Option<bool>,
    /// Retired settings ([`crate::tuning::RETIRED`]): refused, naming
    /// the key, rather than as unknown fields.
    pub policy_skip: Option<toml::Value>,
    pub refill_after_ready: Option<toml::Value>,
    pub refill_when_quiet: Option<toml::Value>,
    pub incoming_kernel_stub: Option<toml::Value>,
    pub memory_return: Option<bool>,
    pub vmm_users: Option<bool>,
    pub vmm_uid_base: Option<u32>,
    pub ksm_pages_to_scan: Option<u32>,
    pub insecure_registries: Option<Vec<String>>,
    /// Private networks API image builds may pull from (CIDRs).
    pub image_registry_private_allow: Option<Vec<String>>,
    pub image_max_layer_mib: Option<u64>,
    pub image_max_unpacked_mib: Option<u64>,
    pub image_max_entries: Option<u64>,
    pub step_cache_mib: Option<u64>,
    pub fetch_cache_mib: Option<u64>,
    pub lazy_fetch: Option<bool>,
    pub egress_dns: Option<String>,
    /// Private networks guests may reach (CIDRs; file only, no variable).
    pub guest_private_allow: Option<Vec<String>>,
}

/// `[server]`: what `siesta serve` takes (its flags override these).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    pub listen: Option<String>,
    pub warm_template: Option<String>,
    pub sandbox_domain: Option<String>,
    pub volume_size_mib: Option<u64>,
    /// Seconds a client has to send a request's head.
    pub header_timeout_secs: Option<u64>,
    /// Most client connections open at once.
    pub max_connections: Option<u64>,
    /// Most client connections open at once from one address.
    pub max_connections_per_ip: Option<u64>,
    /// `text` (default) or `json`: one JSON object a log line.
    pub log_format: Option<LogFormat>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

impl ConfigFile {
    /// The file for data directory `home` (see the module docs); none is
    /// the defaults.
    pub fn load(home: &Path) -> Result<Self, String> {
        match std::env::var_os("SIESTA_CONFIG") {
            Some(path) => Self::read(Path::new(&path)),
            None => {
                let path = home.join(FILE_NAME);
                if path.exists() {
                    Self::read(&path)
                } else {
                    Ok(Self::default())
                }
            }
        }
    }

    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("configuration file {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("configuration file {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.message().to_string())
    }

    /// Sets what the file sets on `config`.
    pub fn apply(&self, config: &mut NodeConfig) -> Result<(), String> {
        let n = &self.node;
        set(&mut config.qemu, &n.qemu);
        set(&mut config.vcpus, &n.vcpus);
        set(&mut config.memory_mib, &n.memory_mib);
        set(&mut config.pool_size, &n.pool_size);
        set(&mut config.warm_slots, &n.warm_slots);
        set(&mut config.max_slots, &n.max_slots);
        set(&mut config.kernel_args, &n.kernel_args);
        set(&mut config.record_manifest, &n.record_manifest);
        set(&mut config.prefetch, &n.prefetch);
        set(&mut config.prefetch_pad_kib, &n.prefetch_pad_kib);
        set(&mut config.prealloc_memory, &n.prealloc_memory);
        for (key, value) in [
            ("policy_skip", &n.policy_skip),
            ("refill_after_ready", &n.refill_after_ready),
            ("refill_when_quiet", &n.refill_when_quiet),
            ("incoming_kernel_stub", &n.incoming_kernel_stub),
        ] {
            if value.is_some() {
                return Err(crate::tuning::retired_message(&format!("node.{key}")));
            }
        }
        set(&mut config.memory_return, &n.memory_return);
        set(&mut config.vmm_users, &n.vmm_users);
        set(&mut config.vmm_uid_base, &n.vmm_uid_base);
        if n.ksm_pages_to_scan.is_some() {
            config.ksm_pages_to_scan = n.ksm_pages_to_scan;
        }
        set(&mut config.insecure_registries, &n.insecure_registries);
        set(&mut config.image_max_layer_mib, &n.image_max_layer_mib);
        set(
            &mut config.image_max_unpacked_mib,
            &n.image_max_unpacked_mib,
        );
        set(&mut config.image_max_entries, &n.image_max_entries);
        set(&mut config.step_cache_mib, &n.step_cache_mib);
        set(&mut config.fetch_cache_mib, &n.fetch_cache_mib);
        set(&mut config.lazy_fetch, &n.lazy_fetch);
        if let Some(accel) = &n.accel {
            config.accel = accel.parse().map_err(|e| format!("node.accel: {e}"))?;
        }
        if let Some(tag) = &n.net_tag {
            siesta_net::Tag::new(tag).map_err(|e| format!("node.net_tag: {e}"))?;
            config.net_tag = tag.clone();
        }
        if let Some(subnet) = &n.net_subnet {
            config.net_subnet = subnet
                .parse()
                .map_err(|e| format!("node.net_subnet: {e}"))?;
        }
        if let Some(dns) = &n.egress_dns {
            config.egress_dns =
                Some(crate::config::parse_dns(dns).map_err(|e| format!("node.egress_dns: {e}"))?);
        }
        if let Some(nets) = &n.image_registry_private_allow {
            config.image_registry_private_allow =
                crate::config::registry_private_allow(nets.iter().map(String::as_str))
                    .map_err(|e| format!("node.image_registry_private_allow: {e}"))?;
        }
        if let Some(nets) = &n.guest_private_allow {
            config.guest_boundary = guest_boundary(nets)?;
        }
        if let Some(secs) = n.resume_ready_timeout_secs {
            config.resume_ready_timeout = Duration::from_secs(secs);
        }
        if let Some(secs) = n.boot_ready_timeout_secs {
            config.boot_ready_timeout = Duration::from_secs(secs);
        }
        if config.vcpus == 0 || config.memory_mib < 64 {
            return Err("node.vcpus must be at least 1 and node.memory_mib at least 64".into());
        }
        Ok(())
    }
}

fn set<T: Clone>(field: &mut T, value: &Option<T>) {
    if let Some(v) = value {
        *field = v.clone();
    }
}

/// `[node] guest_private_allow`: the private networks the operator opens
/// to guests (see `siesta_net::boundary`).
fn guest_boundary(nets: &[String]) -> Result<siesta_net::Boundary, String> {
    let cidrs = nets
        .iter()
        .map(|n| {
            n.parse()
                .map_err(|e| format!("node.guest_private_allow: {e}"))
        })
        .collect::<Result<Vec<siesta_net::Cidr>, String>>()?;
    siesta_net::Boundary::new(cidrs).map_err(|e| format!("node.guest_private_allow: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_limits_come_from_the_file_or_default() {
        let mut config = NodeConfig::new("/tmp/h");
        assert_eq!(config.image_limits(), siesta_image::ImageLimits::DEFAULT);
        ConfigFile::parse("[node]\nimage_max_unpacked_mib = 2048\nimage_max_entries = 5000\n")
            .unwrap()
            .apply(&mut config)
            .unwrap();
        let limits = config.image_limits();
        assert_eq!(limits.max_unpacked_bytes, 2 << 30);
        assert_eq!(limits.max_entries, 5000);
        assert_eq!(limits.max_layer_bytes, 16 << 30);
    }

    #[test]
    fn a_retired_setting_is_refused_by_name() {
        for (key, _) in crate::tuning::RETIRED {
            let file = ConfigFile::parse(&format!("[node]\n{key} = false\n")).unwrap();
            let err = file.apply(&mut NodeConfig::new("/tmp/h")).unwrap_err();
            assert!(
                err.contains(&format!("node.{key}")) && err.contains("no longer a setting"),
                "{err}"
            );
        }
    }

    #[test]
    fn the_file_sets_what_it_names_and_leaves_the_rest() {
        let file = ConfigFile::parse(
            "[node]\nvcpus = 2\nmemory_mib = 1024\nmax_slots = 8\nresume_ready_timeout_secs = 12\n\
             accel = \"tcg\"\ninsecure_registries = [\"reg.lan:5000\"]\n\n\
             [server]\nlisten = \"0.0.0.0:3000\"\nlog_format = \"json\"\n",
        )
        .unwrap();
        let mut config = NodeConfig::new("/tmp/h");
        file.apply(&mut config).unwrap();
        assert_eq!(
            (config.vcpus, config.memory_mib, config.max_slots),
            (2, 1024, 8)
        );
        assert_eq!(config.resume_ready_timeout, Duration::from_secs(12));
        assert_eq!(config.insecure_registries, ["reg.lan:5000"]);
        assert_eq!(config.pool_size, NodeConfig::new("/tmp/h").pool_size);
        assert_eq!(file.server.listen.as_deref(), Some("0.0.0.0:3000"));
        assert_eq!(file.server.log_format, Some(LogFormat::Json));
    }

    #[test]
    fn an_unknown_key_is_named() {
        for (text, key) in [
            ("[node]\nvcpu = 2\n", "vcpu"),
            ("[server]\nport = 1\n", "port"),
            ("[nodes]\n", "nodes"),
        ] {
            let err = ConfigFile::parse(text).unwrap_err();
            assert!(err.contains(key), "{text:?}: {err}");
        }
        let err = ConfigFile::parse("[node]\nvcpus = \"two\"\n").unwrap_err();
        assert!(err.contains("invalid type"), "{err}");
        let bad = ConfigFile::parse("[node]\nnet_tag = \"Bad1\"\n").unwrap();
        assert!(bad
            .apply(&mut NodeConfig::new("/h"))
            .unwrap_err()
            .contains("node.net_tag"));
    }

    #[test]
    fn an_operator_opens_private_networks_to_guests_but_not_the_metadata_service() {
        let file = ConfigFile::parse("[node]\nguest_private_allow = [\"10.1.2.0/24\"]\n").unwrap();
        let mut config = NodeConfig::new("/h");
        assert!(!config.guest_boundary.allows("10.1.2.3".parse().unwrap()));
        file.apply(&mut config).unwrap();
        assert!(config.guest_boundary.allows("10.1.2.3".parse().unwrap()));
        assert!(!config.guest_boundary.allows("10.1.3.3".parse().unwrap()));
        for (bad, why) in [
            ("[\"169.254.169.254\"]", "no guest may reach"),
            ("[\"10.1.2\"]", "not an IPv4 address"),
        ] {
            let file =
                ConfigFile::parse(&format!("[node]\nguest_private_allow = {bad}\n")).unwrap();
            let err = file.apply(&mut NodeConfig::new("/h")).unwrap_err();
            assert!(
                err.contains("node.guest_private_allow") && err.contains(why),
                "{err}"
            );
        }
    }

    #[test]
    fn an_operator_opens_private_registries_to_api_builds_but_not_link_local_space() {
        let mut config = NodeConfig::new("/h");
        let closed = config.api_image_reach();
        assert!(closed.check("r", "127.0.0.1".parse().unwrap()).is_err());
        ConfigFile::parse(
            "[node]\nimage_registry_private_allow = [\"127.0.0.1/32\", \"::1\", \"10.1.0.0/16\"]\n",
        )
        .unwrap()
        .apply(&mut config)
        .unwrap();
        let opened = config.api_image_reach();
        for ip in ["127.0.0.1", "::1", "10.1.2.3"] {
            assert!(opened.check("r", ip.parse().unwrap()).is_ok(), "{ip}");
        }
        assert!(opened.check("r", "10.2.0.1".parse().unwrap()).is_err());
        for (bad, why) in [
            ("[\"169.254.169.254\"]", "link-local"),
            ("[\"0.0.0.0/0\"]", "link-local"),
            ("[\"10.1\"]", "not an IP address"),
        ] {
            let file =
                ConfigFile::parse(&format!("[node]\nimage_registry_private_allow = {bad}\n"))
                    .unwrap();
            let err = file.apply(&mut NodeConfig::new("/h")).unwrap_err();
            assert!(
                err.contains("node.image_registry_private_allow") && err.contains(why),
                "{err}"
            );
        }
    }

    #[test]
    fn a_missing_default_file_is_the_defaults_and_a_named_one_must_exist() {
        let home = tempfile::tempdir().unwrap();
        let file = ConfigFile::read(&home.path().join("nope.toml")).unwrap_err();
        assert!(file.contains("nope.toml"), "{file}");
        std::fs::write(home.path().join(FILE_NAME), "[node]\nvcpus = 3\n").unwrap();
        let read = ConfigFile::read(&home.path().join(FILE_NAME)).unwrap();
        assert_eq!(read.node.vcpus, Some(3));
    }
}
