//! Services (`core/v1`): defaults, validation, ClusterIP and NodePort
//! allocation (upstream's service REST storage and its allocators), and
//! the `kubectl get services` columns.

use serde_json::{json, Value};

use super::{NameRule, Strategy, Subresource};
use crate::apiserver::defaults::{obj_field, set};
use crate::apiserver::ipalloc::{self, Allocation};
use crate::apiserver::objects;
use crate::apiserver::status::{ApiError, ApiResult, Cause};
use crate::apiserver::table::{age_cell, i, name_cell, or_none, s, Col, AGE, NAME};
use crate::apiserver::Req;
use crate::apiserver::{validation, ApiServer};

pub struct Service;

static SUBRESOURCES: &[Subresource] = &[super::proxy("ServiceProxyOptions")];

impl Strategy for Service {
    fn subresources(&self) -> &'static [Subresource] {
        SUBRESOURCES
    }

    fn prepare_for_create(&self, _r: &Req, obj: &mut Value) {
        obj["status"] = json!({"loadBalancer": {}});
    }

    fn default(&self, obj: &mut Value) {
        let spec = obj_field(obj, "spec");
        set(spec, "type", json!("ClusterIP"));
        set(spec, "sessionAffinity", json!("None"));
        let ty = spec
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("ClusterIP")
            .to_string();
        if ty != "ExternalName" {
            set(spec, "internalTrafficPolicy", json!("Cluster"));
        }
        if matches!(ty.as_str(), "NodePort" | "LoadBalancer") {
            set(spec, "externalTrafficPolicy", json!("Cluster"));
        }
        if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
            for p in ports.iter_mut().filter_map(Value::as_object_mut) {
                set(p, "protocol", json!("TCP"));
                if !p.contains_key("targetPort") {
                    if let Some(port) = p.get("port").cloned() {
                        p.insert("targetPort".into(), port);
                    }
                }
            }
        }
    }

    fn name_rule(&self) -> NameRule {
        NameRule::Label1035
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        validate_spec(obj, &mut c);
        c
    }

    fn allocate(
        &self,
        api: &ApiServer,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> ApiResult<Allocation> {
        allocate(api, obj, old)
    }

    fn release(&self, api: &ApiServer, obj: &Value) {
        release(api, obj)
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["spec.clusterIP", "spec.type"]
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            ("Type", "string", 0, "The type of the service."),
            ("Cluster-IP", "string", 0, "The cluster IP of the service."),
            (
                "External-IP",
                "string",
                0,
                "The external IP of the service.",
            ),
            ("Port(s)", "string", 0, "The ports of the service."),
            AGE,
            ("Selector", "string", 1, "The selector of the service."),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let spec = &obj["spec"];
        let st = &obj["status"];
        let ty = s(&spec["type"]);
        let ext: Vec<String> = match ty.as_str() {
            "ExternalName" => vec![s(&spec["externalName"])],
            _ => {
                let mut v: Vec<String> = spec["externalIPs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(s)
                    .collect();
                for ing in st["loadBalancer"]["ingress"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    v.push(if ing["ip"].is_string() {
                        s(&ing["ip"])
                    } else {
                        s(&ing["hostname"])
                    });
                }
                if v.is_empty() && ty == "LoadBalancer" {
                    v.push("<pending>".into());
                }
                v
            }
        };
        let ports: Vec<String> = spec["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| match p["nodePort"].as_i64() {
                Some(np) if np > 0 => format!("{}:{}/{}", i(&p["port"]), np, s(&p["protocol"])),
                _ => format!("{}/{}", i(&p["port"]), s(&p["protocol"])),
            })
            .collect();
        let sel: Vec<String> = spec["selector"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| format!("{k}={}", s(v))).collect())
            .unwrap_or_default();
        vec![
            name_cell(obj),
            json!(ty),
            json!(or_none(s(&spec["clusterIP"]))),
            json!(or_none(ext.join(","))),
            json!(or_none(ports.join(","))),
            age_cell(obj),
            json!(or_none(sel.join(","))),
        ]
    }
}

fn validate_spec(obj: &Value, c: &mut Vec<Cause>) {
    let spec = &obj["spec"];
    let ty = spec["type"].as_str().unwrap_or("ClusterIP");
    if !matches!(
        ty,
        "ClusterIP" | "NodePort" | "LoadBalancer" | "ExternalName"
    ) {
        c.push(Cause::not_supported(
            "spec.type",
            ty,
            &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
        ));
    }
    let ports = spec["ports"].as_array();
    let headless = spec["clusterIP"].as_str() == Some("None");
    if ports.is_none_or(|p| p.is_empty()) && ty != "ExternalName" && !headless {
        c.push(Cause::required("spec.ports"));
    }
    let multi = ports.is_some_and(|p| p.len() > 1);
    let mut names: Vec<&str> = Vec::new();
    let mut seen: Vec<(i64, &str)> = Vec::new();
    for (i, p) in ports.into_iter().flatten().enumerate() {
        let path = format!("spec.ports[{i}]");
        let n = p["port"].as_i64().unwrap_or(0);
        if !(1..=65535).contains(&n) {
            c.push(Cause::invalid(
                format!("{path}.port"),
                &n.to_string(),
                "must be between 1 and 65535, inclusive",
            ));
        }
        // Port names end up in DNS SRV names and in the proxy's rules.
        let name = p["name"].as_str().unwrap_or_default();
        if multi && name.is_empty() {
            c.push(Cause::required(format!("{path}.name")));
        } else if !name.is_empty() {
            validation::dns_label(&format!("{path}.name"), name, c);
            if names.contains(&name) {
                c.push(Cause::duplicate(format!("{path}.name"), name));
            }
            names.push(name);
        }
        let proto = p["protocol"].as_str().unwrap_or("TCP");
        if !matches!(proto, "TCP" | "UDP" | "SCTP") {
            c.push(Cause::not_supported(
                format!("{path}.protocol"),
                proto,
                &["SCTP", "TCP", "UDP"],
            ));
        }
        if seen.contains(&(n, proto)) {
            c.push(Cause::duplicate(
                path.clone(),
                &format!("{{\"Protocol\":\"{proto}\",\"Port\":{n}}}"),
            ));
        }
        seen.push((n, proto));
        match &p["targetPort"] {
            Value::String(t) => validation::port_name(&format!("{path}.targetPort"), t, c),
            Value::Number(t) if !(1..=65535).contains(&t.as_i64().unwrap_or(0)) => {
                c.push(Cause::invalid(
                    format!("{path}.targetPort"),
                    &t.to_string(),
                    "must be between 1 and 65535, inclusive",
                ))
            }
            _ => {}
        }
    }
    for (i, ip) in spec["externalIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let ip = ip.as_str().unwrap_or_default();
        validation::ip_address(&format!("spec.externalIPs[{i}]"), ip, "", c);
    }
    if let Some(ip) = spec["loadBalancerIP"].as_str().filter(|ip| !ip.is_empty()) {
        validation::ip_address("spec.loadBalancerIP", ip, "", c);
    }
    let ingress = obj["status"]["loadBalancer"]["ingress"].as_array();
    for (i, ing) in ingress.into_iter().flatten().enumerate() {
        if let Some(ip) = ing["ip"].as_str().filter(|ip| !ip.is_empty()) {
            validation::ip_address(&format!("status.loadBalancer.ingress[{i}].ip"), ip, "", c);
        }
    }
}

/// ClusterIP and NodePorts for a service; on update, `old` keeps its own.
/// On failure, what was taken before it goes back.
fn allocate(api: &ApiServer, obj: &mut Value, old: Option<&Value>) -> ApiResult<Allocation> {
    let mut out = Allocation::default();
    match take(api, obj, old, &mut out) {
        Ok(()) => Ok(out),
        Err(e) => {
            out.release(&api.ips);
            Err(e)
        }
    }
}

fn take(
    api: &ApiServer,
    obj: &mut Value,
    old: Option<&Value>,
    out: &mut Allocation,
) -> ApiResult<()> {
    let name = objects::name(obj).unwrap_or_default().to_string();
    let invalid = |field: &str, value: &str, e: ipalloc::Error| {
        ApiError::invalid(
            "Service",
            "",
            &name,
            vec![Cause::invalid(field, value, &e.to_string())],
        )
    };
    let ty = obj["spec"]["type"]
        .as_str()
        .unwrap_or("ClusterIP")
        .to_string();
    if ty == "ExternalName" {
        return Ok(());
    }
    let old_ip = old
        .and_then(|o| o["spec"]["clusterIP"].as_str())
        .unwrap_or_default()
        .to_string();
    let want = obj["spec"]["clusterIP"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let ip = if !old_ip.is_empty() && (want.is_empty() || want == old_ip) {
        old_ip
    } else if !old_ip.is_empty() {
        return Err(ApiError::invalid(
            "Service",
            "",
            &name,
            vec![Cause::invalid(
                "spec.clusterIPs[0]",
                &want,
                "may not change once set",
            )],
        ));
    } else if want == "None" {
        "None".to_string()
    } else {
        let want_ip = if want.is_empty() {
            None
        } else {
            Some(want.parse().map_err(|_| {
                ApiError::invalid(
                    "Service",
                    "",
                    &name,
                    vec![Cause::invalid(
                        "spec.clusterIP",
                        &want,
                        "must be a valid IP address",
                    )],
                )
            })?)
        };
        let ip = api
            .ips
            .allocate(want_ip)
            .map_err(|e| invalid("spec.clusterIPs", &want, e))?
            .to_string();
        out.ip(ip.clone());
        ip
    };
    obj["spec"]["clusterIP"] = json!(ip);
    obj["spec"]["clusterIPs"] = json!([ip]);
    if ip != "None" || obj["spec"]["ipFamilies"].is_null() {
        obj["spec"]["ipFamilies"] = json!(["IPv4"]);
        obj["spec"]["ipFamilyPolicy"] = json!("SingleStack");
    }
    if matches!(ty.as_str(), "NodePort" | "LoadBalancer") {
        let old_ports: Vec<(i64, i64)> = old
            .and_then(|o| o["spec"]["ports"].as_array())
            .into_iter()
            .flatten()
            .filter_map(|p| Some((p["port"].as_i64()?, p["nodePort"].as_i64()?)))
            .collect();
        if let Some(ports) = obj["spec"]["ports"].as_array_mut() {
            for (i, p) in ports.iter_mut().enumerate() {
                let port = p["port"].as_i64().unwrap_or(0);
                let keep = old_ports
                    .iter()
                    .find(|(op, _)| *op == port)
                    .map(|(_, np)| *np);
                // 0 means "unset" (protobuf clients send it for an absent port).
                match (p["nodePort"].as_i64().filter(|n| *n != 0), keep) {
                    (Some(np), Some(k)) if np == k => {}
                    (None, Some(k)) => p["nodePort"] = json!(k),
                    (want, _) => {
                        let np = api.ips.allocate_port(want.map(|w| w as u16)).map_err(|e| {
                            invalid(
                                &format!("spec.ports[{i}].nodePort"),
                                &want.unwrap_or(0).to_string(),
                                e,
                            )
                        })?;
                        out.port(np);
                        p["nodePort"] = json!(np);
                    }
                }
            }
        }
    }
    Ok(())
}

fn release(api: &ApiServer, svc: &Value) {
    if let Some(ip) = svc["spec"]["clusterIP"].as_str() {
        api.ips.release(ip);
    }
    for p in svc["spec"]["ports"].as_array().into_iter().flatten() {
        if let Some(np) = p["nodePort"].as_i64() {
            api.ips.release_port(np as u16);
        }
    }
}
