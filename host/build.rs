//! Builds the policy WASM component that the `turnsafe` binary embeds.
//!
//! The policy crate is compiled for `wasm32-unknown-unknown` (no WASI, so
//! the core module imports nothing), optimised for size by binaryen's
//! `wasm-opt -Oz` (required: the build fails and says how to install it
//! when it is missing), stripped of debug and name sections, and wrapped
//! into a component with `wit-component`, whose own name and producer
//! sections go too. The result has no imports at all, which
//! `wasm32-wasip2` cannot give: Rust's std there imports `wasi:cli` and
//! `wasi:io`.
//!
//! The inner cargo uses its own target directory so it never waits on the
//! lock the outer build holds, and runs on every policy or WIT change, so
//! a stale `.wasm` can never be embedded or tested.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-unknown-unknown";

fn main() {
    if let Err(e) = run() {
        eprintln!("error: building the turnsafe policy component failed: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    // Only the `wasm-engine` feature embeds the component.
    if env::var_os("CARGO_FEATURE_WASM_ENGINE").is_none() {
        return Ok(());
    }
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let root = manifest_dir
        .parent()
        .ok_or("host crate has no parent directory")?
        .to_path_buf();
    for watched in ["policy/src", "policy/Cargo.toml", "wit", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    println!("cargo:rerun-if-env-changed=TURNSAFE_WASM_TARGET_DIR");

    let target_dir = env::var_os("TURNSAFE_WASM_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target").join("policy-wasm"));
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Local paths must not leak into the component, so its bytes are the
    // same wherever it is built.
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let mut remap = format!("--remap-path-prefix={}=/turnsafe", root.display());
    if let Some(home) = cargo_home {
        // rustc tries these last-first, so the broad prefix goes first.
        remap.push_str(&format!(" --remap-path-prefix={}=/cargo", home.display()));
        // Each registry source folder is named for its index; map them all.
        if let Ok(rd) = std::fs::read_dir(home.join("registry").join("src")) {
            for entry in rd.flatten() {
                remap.push_str(&format!(" --remap-path-prefix={}=/deps", entry.path().display()));
            }
        }
    }
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args([
            "build",
            "--quiet",
            "--locked",
            "-p",
            "turnsafe-policy",
            "--lib",
            "--release",
            "--target",
            TARGET,
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        // The outer build's wrappers and flags are for the host target.
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env("RUSTFLAGS", &remap)
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("CARGO_MAKEFLAGS")
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "z")
        .env("CARGO_PROFILE_RELEASE_LTO", "true")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_PANIC", "abort")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_INCREMENTAL", "false");
    let status = cmd.status().map_err(|e| format!("could not run cargo: {e}"))?;
    if !status.success() {
        return Err(format!(
            "`cargo build -p turnsafe-policy --target {TARGET}` failed ({status}). \
             Is the target installed? Run `rustup target add {TARGET}`."
        ));
    }
    let core_path = target_dir.join(TARGET).join("release").join("turnsafe_policy.wasm");
    let core = std::fs::read(&core_path).map_err(|e| format!("reading {}: {e}", core_path.display()))?;

    let raw = encode(&core)?;
    let optimized = wasm_opt(&core_path)?;
    let stripped_core = strip_custom_sections(&optimized)?;
    let component = strip_component_custom_sections(&encode(&stripped_core)?)?;

    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    write(&out_dir.join("turnsafe_policy.component.wasm"), &component)?;
    println!("cargo:rustc-env=TURNSAFE_COMPONENT_UNSTRIPPED_LEN={}", raw.len());
    Ok(())
}

/// The core module after `wasm-opt -Oz`: 12 KB less than rustc's own
/// `opt-level = "z"` gives (docs/EMBEDDING.md, "Size"). The custom section
/// wit-component reads (`component-type`) is kept; the rest is stripped after.
fn wasm_opt(core_path: &Path) -> Result<Vec<u8>, String> {
    let out = core_path.with_extension("opt.wasm");
    let status = Command::new("wasm-opt")
        .arg("-Oz")
        .arg(core_path)
        .arg("-o")
        .arg(&out)
        .status()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => "`wasm-opt` was not found: the policy component is optimised with \
                 binaryen's wasm-opt. Install binaryen (Debian: `apt-get install binaryen`) and build again."
                .to_string(),
            _ => format!("could not run wasm-opt: {e}"),
        })?;
    if !status.success() {
        return Err(format!("`wasm-opt -Oz {}` failed ({status})", core_path.display()));
    }
    std::fs::read(&out).map_err(|e| format!("reading {}: {e}", out.display()))
}

fn encode(core: &[u8]) -> Result<Vec<u8>, String> {
    wit_component::ComponentEncoder::default()
        .module(core)
        .and_then(|e| e.validate(true).encode())
        .map_err(|e| format!("wit-component could not make a component: {e:#}"))
}

/// Drop debug info, names and producer notes; keep `component-type`, which
/// wit-component needs.
fn strip_custom_sections(module: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = wasm_encoder::Module::new();
    for payload in wasmparser::Parser::new(0).parse_all(module) {
        let payload = payload.map_err(|e| format!("parsing the core module: {e}"))?;
        if let wasmparser::Payload::CustomSection(c) = &payload {
            let name = c.name();
            if !name.starts_with("component-type") {
                continue;
            }
        }
        if let Some((id, range)) = payload.as_section() {
            out.section(&wasm_encoder::RawSection {
                id,
                data: &module[range.start as usize..range.end as usize],
            });
        }
    }
    Ok(out.finish())
}

/// Drop the custom sections wit-component adds at the component's own
/// level (`component-name`, `producers`) and in the core modules it nests
/// (`producers`): notes for debuggers and tools, which no runtime reads.
/// Nested components are copied whole.
fn strip_component_custom_sections(component: &[u8]) -> Result<Vec<u8>, String> {
    use wasmparser::Payload;
    let mut out = wasm_encoder::Component::new();
    // parse_all also walks nested modules and components; only the
    // component's own sections (depth 0) are copied or dropped here.
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(component) {
        let payload = payload.map_err(|e| format!("parsing the component: {e}"))?;
        let nested = matches!(
            payload,
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. }
        );
        if let Payload::End(_) = payload {
            depth = depth.saturating_sub(1);
            continue;
        }
        if depth == 0
            && !matches!(payload, Payload::CustomSection(_))
            && let Some((id, range)) = payload.as_section()
        {
            let data = &component[range.start as usize..range.end as usize];
            // A nested core module (the policy's, and the small shims
            // wit-component adds) loses its own `producers` section too.
            let module = match payload {
                Payload::ModuleSection { .. } => Some(strip_custom_sections(data)?),
                _ => None,
            };
            out.section(&wasm_encoder::RawSection {
                id,
                data: module.as_deref().unwrap_or(data),
            });
        }
        if nested {
            depth += 1;
        }
    }
    Ok(out.finish())
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(path, bytes).map_err(|e| format!("writing {}: {e}", path.display()))
}
