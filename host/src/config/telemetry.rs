//! `[telemetry]`: where spans are exported over OTLP. Like `[log]`, read twice: by the CLI
//! before the log starts ([`telemetry_in`]), because the exporter is a layer of the log's
//! subscriber, and with the rest of the file, so that a bad endpoint is a config error.
//! The standard OpenTelemetry variables win over the file, as `EBB_LOG_FORMAT` wins over
//! `[log] format`: a Deployment points ebb at its collector without editing ebb.toml.

use serde::Deserialize;

/// `[telemetry]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryFile {
    /// The collector's OTLP base URL (`http://collector:4318`; for `grpc`,
    /// `http://collector:4317`); spans go to `<url>/v1/traces` over HTTP. None: no export,
    /// unless `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set.
    pub otlp_endpoint: Option<String>,
    /// `http/protobuf` (default) or `grpc`; `OTEL_EXPORTER_OTLP_PROTOCOL` wins.
    pub protocol: Option<String>,
    /// The `service.name` of the spans. Default `ebb`; `OTEL_SERVICE_NAME` wins.
    pub service_name: Option<String>,
}

pub use crate::telemetry::{OtlpExport, OtlpProtocol};

const ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const TRACES_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
const PROTOCOL_ENV: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
const TRACES_PROTOCOL_ENV: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
const SERVICE_NAME_ENV: &str = "OTEL_SERVICE_NAME";

impl TelemetryFile {
    /// The export the file and `env` (the process's variables, in tests a table) ask for:
    /// `None` when neither names an endpoint; an error naming the key or variable at fault.
    pub fn resolve(&self, env: impl Fn(&str) -> Option<String>) -> Result<Option<OtlpExport>, String> {
        // An empty variable is an unset one, as the OpenTelemetry SDKs take it.
        let env = |var: &str| env(var).filter(|value| !value.trim().is_empty());
        let protocol = match env(TRACES_PROTOCOL_ENV).map(|p| (TRACES_PROTOCOL_ENV, p)).or_else(|| env(PROTOCOL_ENV).map(|p| (PROTOCOL_ENV, p))) {
            Some((var, name)) => protocol(var, &name)?,
            None => self.protocol.as_deref().map(|name| protocol("telemetry.protocol", name)).transpose()?.unwrap_or(OtlpProtocol::HttpProtobuf),
        };
        // The signal's own variable is the full URL; a base URL gets the signal's path.
        let (key, url, full) = match (env(TRACES_ENDPOINT_ENV), env(ENDPOINT_ENV), &self.otlp_endpoint) {
            (Some(url), _, _) => (TRACES_ENDPOINT_ENV, url, true),
            (None, Some(url), _) => (ENDPOINT_ENV, url, false),
            (None, None, Some(url)) => ("telemetry.otlp_endpoint", url.clone(), false),
            (None, None, None) => return Ok(None),
        };
        let parsed = reqwest::Url::parse(url.trim()).map_err(|error| format!("{key}: must be an http:// or https:// URL, got {url:?} ({error})"))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none_or(str::is_empty) {
            return Err(format!("{key}: must be an http:// or https:// URL, got {url:?}"));
        }
        // The exporter sends no credentials from the URL, and the URL is logged when exports fail.
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(format!(
                "{key}: must not hold a user name or password (they are not sent, and the URL is logged); got a URL for {}",
                parsed.host_str().unwrap_or_default()
            ));
        }
        let endpoint = match protocol {
            OtlpProtocol::HttpProtobuf if !full => with_traces_path(parsed),
            _ => url.trim().to_string(),
        };
        let service_name = env(SERVICE_NAME_ENV).or_else(|| self.service_name.clone()).unwrap_or_else(|| "ebb".to_string());
        Ok(Some(OtlpExport { endpoint, protocol, service_name }))
    }
}

/// `base` with the traces signal's path added to its own (its query kept after it).
fn with_traces_path(mut base: reqwest::Url) -> String {
    let path = format!("{}/v1/traces", base.path().trim_end_matches('/'));
    base.set_path(&path);
    base.to_string()
}

/// The protocol named `name` (by `key`), or why not.
fn protocol(key: &str, name: &str) -> Result<OtlpProtocol, String> {
    match name.trim() {
        "http/protobuf" => Ok(OtlpProtocol::HttpProtobuf),
        "grpc" => Ok(OtlpProtocol::Grpc),
        _ => Err(format!("{key}: must be \"http/protobuf\" or \"grpc\", got {name:?}")),
    }
}

/// The `[telemetry]` table of config text, read before the log starts; `None` when the text
/// has none or it does not parse (the full parse reports that, through the log).
pub(crate) fn telemetry_in(text: &str) -> Option<TelemetryFile> {
    let table: toml::Table = toml::from_str(text).ok()?;
    table.get("telemetry")?.clone().try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(file: TelemetryFile, vars: &[(&str, &str)]) -> Result<Option<OtlpExport>, String> {
        file.resolve(|var| vars.iter().find(|(name, _)| *name == var).map(|(_, value)| value.to_string()))
    }

    fn endpoint(url: &str) -> TelemetryFile {
        TelemetryFile { otlp_endpoint: Some(url.to_string()), ..TelemetryFile::default() }
    }

    #[test]
    fn no_endpoint_anywhere_exports_nothing() {
        assert_eq!(resolve(TelemetryFile::default(), &[]), Ok(None));
        assert_eq!(resolve(TelemetryFile::default(), &[(ENDPOINT_ENV, " ")]), Ok(None), "an empty variable is unset");
    }

    #[test]
    fn a_base_url_gets_the_traces_path_over_http_and_is_kept_for_grpc() {
        let export = resolve(endpoint("http://collector:4318/"), &[]).unwrap().unwrap();
        assert_eq!(
            (export.endpoint.as_str(), export.protocol, export.service_name.as_str()),
            ("http://collector:4318/v1/traces", OtlpProtocol::HttpProtobuf, "ebb")
        );
        let grpc = resolve(endpoint("http://collector:4317"), &[(PROTOCOL_ENV, "grpc")]).unwrap().unwrap();
        assert_eq!((grpc.endpoint.as_str(), grpc.protocol), ("http://collector:4317", OtlpProtocol::Grpc));
    }

    #[test]
    fn the_environment_wins_over_the_file() {
        let vars = [(ENDPOINT_ENV, "http://env:4318"), (SERVICE_NAME_ENV, "orders-worker")];
        let export = resolve(endpoint("http://file:4318"), &vars).unwrap().unwrap();
        assert_eq!((export.endpoint.as_str(), export.service_name.as_str()), ("http://env:4318/v1/traces", "orders-worker"));
        let traces = resolve(endpoint("http://file:4318"), &[(ENDPOINT_ENV, "http://env:4318"), (TRACES_ENDPOINT_ENV, "http://traces:9999/custom")]);
        assert_eq!(traces.unwrap().unwrap().endpoint, "http://traces:9999/custom", "the signal's own variable is taken as it is");
    }

    #[test]
    fn a_base_urls_query_stays_after_the_traces_path() {
        let export = resolve(endpoint("http://collector:4318/otel/?tenant=a"), &[]).unwrap().unwrap();
        assert_eq!(export.endpoint, "http://collector:4318/otel/v1/traces?tenant=a");
    }

    #[test]
    fn an_endpoint_with_credentials_is_refused_without_repeating_them() {
        for bad in ["http://user:secretpw@collector:4318", "http://user@collector:4318"] {
            let error = resolve(endpoint(bad), &[]).unwrap_err();
            assert!(error.starts_with("telemetry.otlp_endpoint: must not hold a user name or password"), "{bad}: {error}");
            assert!(!error.contains("secretpw") && !error.contains("user@"), "the error repeats the credentials: {error}");
        }
    }

    #[test]
    fn an_endpoint_that_is_not_an_http_url_is_refused_naming_its_key() {
        for bad in ["collector:4318", "not a url", "ftp://collector", "http://"] {
            let error = resolve(endpoint(bad), &[]).unwrap_err();
            assert!(error.starts_with("telemetry.otlp_endpoint: must be an http:// or https:// URL"), "{bad}: {error}");
        }
        let error = resolve(TelemetryFile::default(), &[(ENDPOINT_ENV, "nope")]).unwrap_err();
        assert!(error.starts_with(ENDPOINT_ENV), "{error}");
    }

    #[test]
    fn an_unknown_protocol_is_refused_naming_its_key() {
        let file = TelemetryFile { protocol: Some("http/json".into()), ..endpoint("http://c:4318") };
        assert_eq!(resolve(file, &[]).unwrap_err(), "telemetry.protocol: must be \"http/protobuf\" or \"grpc\", got \"http/json\"");
    }

    #[test]
    fn the_table_is_read_from_config_text_alone() {
        let read = telemetry_in("[telemetry]\notlp_endpoint = \"http://c:4318\"\n[queues.q]\n").unwrap();
        assert_eq!(read.otlp_endpoint.as_deref(), Some("http://c:4318"));
        assert!(telemetry_in("[queues.q]\n").is_none());
        assert!(telemetry_in("[telemetry]\nbogus = 1\n").is_none());
    }
}
