//! Manifest parsing on arbitrary bytes: a file manifest and a URL body (Pod or PodList), then
//! ingestion (fingerprints) of every pod accepted. Nothing may panic; errors must name the source.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use swiftlet::config::{StoredPod, manifest};

const FILE: &str = "/etc/kubernetes/manifests/fuzz.yaml";
const URL: &str = "http://127.0.0.1:1/pods";

fuzz_target!(|data: &[u8]| {
    match manifest::parse(Path::new(FILE), data, "fuzz-node") {
        Ok(pod) => {
            let _ = StoredPod::new(pod);
        }
        Err(e) => assert!(e.to_string().contains(FILE), "{e}"),
    }
    match manifest::parse_url(URL, data, "fuzz-node") {
        Ok(items) => {
            for item in items {
                match item {
                    // Fingerprinted (and packed) by the parser already; handed over as the
                    // source hands its pods to the mux.
                    Ok(mut pod) => {
                        let _ = pod.hand_over();
                    }
                    Err(e) => assert!(e.to_string().contains(URL), "{e}"),
                }
            }
        }
        Err(e) => assert!(e.to_string().contains(URL), "{e}"),
    }
});
