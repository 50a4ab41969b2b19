//! Kinds with few rules of their own: Endpoints and EndpointSlices (their
//! addresses and port names, which the service proxy writes into its
//! rules, are validated), Leases; and how `kubectl get`
//! prints them.

use serde_json::{json, Value};

use super::Strategy;
use crate::apiserver::status::Cause;
use crate::apiserver::table::{age_cell, i, name_cell, or_none, or_unset, s, Col, AGE, NAME};
use crate::apiserver::validation;

pub struct Endpoints;
pub struct Lease;
pub struct EndpointSlice;

/// The first three of a list, and how many more (upstream's
/// `formatEndpoints`).
fn first_three(all: &[String]) -> String {
    if all.len() > 3 {
        format!("{} + {} more...", all[..3].join(","), all.len() - 3)
    } else {
        all.join(",")
    }
}

/// A port of an Endpoints subset or an EndpointSlice: an optional DNS
/// label name, a number in range.
fn endpoint_port(p: &Value, path: &str, c: &mut Vec<Cause>) {
    if let Some(name) = p["name"].as_str().filter(|n| !n.is_empty()) {
        validation::dns_label(&format!("{path}.name"), name, c);
    }
    if let Some(n) = p["port"].as_i64() {
        if !(1..=65535).contains(&n) {
            c.push(Cause::invalid(
                format!("{path}.port"),
                &n.to_string(),
                "must be between 1 and 65535, inclusive",
            ));
        }
    }
}

impl Strategy for Endpoints {
    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        for (i, sub) in obj["subsets"].as_array().into_iter().flatten().enumerate() {
            for field in ["addresses", "notReadyAddresses"] {
                for (j, a) in sub[field].as_array().into_iter().flatten().enumerate() {
                    let path = format!("subsets[{i}].{field}[{j}].ip");
                    validation::ip_address(&path, a["ip"].as_str().unwrap_or_default(), "", &mut c);
                }
            }
            for (j, p) in sub["ports"].as_array().into_iter().flatten().enumerate() {
                endpoint_port(p, &format!("subsets[{i}].ports[{j}]"), &mut c);
            }
        }
        c
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            ("Endpoints", "string", 0, "Endpoints of the service"),
            AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let mut eps: Vec<String> = Vec::new();
        for sub in obj["subsets"].as_array().into_iter().flatten() {
            for a in sub["addresses"].as_array().into_iter().flatten() {
                let ports: Vec<i64> = sub["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| i(&p["port"]))
                    .collect();
                if ports.is_empty() {
                    eps.push(s(&a["ip"]));
                }
                for p in ports {
                    eps.push(format!("{}:{p}", s(&a["ip"])));
                }
            }
        }
        vec![
            name_cell(obj),
            json!(or_none(first_three(&eps))),
            age_cell(obj),
        ]
    }
}

impl Strategy for Lease {
    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            ("Holder", "string", 0, "The holder of the lease."),
            AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            name_cell(obj),
            json!(s(&obj["spec"]["holderIdentity"])),
            age_cell(obj),
        ]
    }
}

impl Strategy for EndpointSlice {
    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let family = obj["addressType"].as_str().unwrap_or_default();
        if !matches!(family, "IPv4" | "IPv6" | "FQDN") {
            c.push(Cause::not_supported(
                "addressType",
                family,
                &["FQDN", "IPv4", "IPv6"],
            ));
        }
        for (i, e) in obj["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            for (j, a) in e["addresses"].as_array().into_iter().flatten().enumerate() {
                let path = format!("endpoints[{i}].addresses[{j}]");
                let a = a.as_str().unwrap_or_default();
                if family == "FQDN" {
                    validation::dns_subdomain(&path, a, &mut c);
                } else {
                    validation::ip_address(&path, a, family, &mut c);
                }
            }
        }
        for (i, p) in obj["ports"].as_array().into_iter().flatten().enumerate() {
            endpoint_port(p, &format!("ports[{i}]"), &mut c);
        }
        c
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            ("AddressType", "string", 0, "The IP protocol for this slice"),
            ("Ports", "string", 0, "The ports of this slice"),
            ("Endpoints", "string", 0, "The endpoints of this slice"),
            AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let ports: Vec<String> = obj["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| i(&p["port"]).to_string())
            .collect();
        let addrs: Vec<String> = obj["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
            .map(|a| s(&a))
            .collect();
        vec![
            name_cell(obj),
            json!(s(&obj["addressType"])),
            json!(or_unset(ports.join(","))),
            json!(or_unset(first_three(&addrs))),
            age_cell(obj),
        ]
    }
}
