//! The policy, run natively or through the embedded WASM component.
//!
//! Both engines expose the same JSON entry points, and the parity tests
//! hold them to byte-identical answers.

use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, Store};

/// The policy component this binary carries, built by `build.rs` from the
/// workspace's `policy/` and `wit/` at compile time.
pub static COMPONENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/turnsafe_policy.component.wasm"));

/// Size of the component before debug and name sections were stripped.
pub const COMPONENT_UNSTRIPPED_LEN: &str = env!("TURNSAFE_COMPONENT_UNSTRIPPED_LEN");

mod bindings {
    wasmtime::component::bindgen!({
        world: "policy",
        path: "../wit",
    });
}

pub use bindings::exports::turnsafe::policy::engine as wit;

/// Which implementation answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineKind {
    /// The policy crate, linked into this binary.
    Native,
    /// The embedded component, run by wasmtime.
    Wasm,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("could not load the policy component: {0:#}")]
    Load(wasmtime::Error),
    #[error("the policy component trapped: {0:#}")]
    Trap(wasmtime::Error),
}

/// JSON entry points shared by both engines.
pub trait PolicyEngine {
    fn classify_json(&mut self, observation: &str) -> Result<String, EngineError>;
    fn explain_json(&mut self, request: &str) -> Result<String, EngineError>;
    fn evaluate_json(&mut self, request: &str) -> Result<String, EngineError>;
    /// One step of the flush machine (`{state, start?, event?}` in).
    fn flush_step_json(&mut self, request: &str) -> Result<String, EngineError>;
    /// One step of a history edit's machine (`{state, sticky?, seed?, edit,
    /// session, event?}` in).
    fn edit_step_json(&mut self, request: &str) -> Result<String, EngineError>;
    /// Whether a writer may take a lease another holder has
    /// (`{now_ms, expires_ms?, local?, server?}` in).
    fn decide_lease_json(&mut self, request: &str) -> Result<String, EngineError>;
    /// How far a failure inside a group's transaction reaches
    /// (`{observation, transaction_open}` in).
    fn decide_scope_json(&mut self, request: &str) -> Result<String, EngineError>;
}

/// The native policy.
#[derive(Debug, Default, Clone, Copy)]
pub struct NativeEngine;

impl PolicyEngine for NativeEngine {
    fn classify_json(&mut self, observation: &str) -> Result<String, EngineError> {
        Ok(turnsafe_policy::json::classify_json(observation))
    }
    fn explain_json(&mut self, request: &str) -> Result<String, EngineError> {
        Ok(turnsafe_policy::json::explain_json(request))
    }
    fn evaluate_json(&mut self, request: &str) -> Result<String, EngineError> {
        Ok(turnsafe_policy::json::evaluate_json(request))
    }
    fn flush_step_json(&mut self, request: &str) -> Result<String, EngineError> {
        Ok(turnsafe_policy::machine::flush_step_json(request))
    }
    fn edit_step_json(&mut self, request: &str) -> Result<String, EngineError> {
        Ok(turnsafe_policy::machine::edit_step_json(request))
    }
    fn decide_lease_json(&mut self, request: &str) -> Result<String, EngineError> {
        Ok(turnsafe_policy::json::decide_lease_json(request))
    }
    fn decide_scope_json(&mut self, request: &str) -> Result<String, EngineError> {
        Ok(turnsafe_policy::json::decide_scope_json(request))
    }
}

/// The component, instantiated once and reused; after a trap the instance
/// is discarded and a fresh one serves the next call.
pub struct WasmEngine {
    engine: Engine,
    component: Component,
    linker: Linker<()>,
    live: Option<(Store<()>, bindings::Policy)>,
}

impl WasmEngine {
    pub fn new() -> Result<WasmEngine, EngineError> {
        Self::from_bytes(COMPONENT)
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<WasmEngine, EngineError> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        let engine = Engine::new(&config).map_err(EngineError::Load)?;
        let component = Component::new(&engine, bytes).map_err(EngineError::Load)?;
        let linker = Linker::new(&engine);
        let mut this = WasmEngine {
            engine,
            component,
            linker,
            live: None,
        };
        this.instance()?;
        Ok(this)
    }

    /// The names the component imports; the policy world declares none.
    pub fn imports(&self) -> Vec<String> {
        self.component
            .component_type()
            .imports(&self.engine)
            .map(|(name, _)| name.to_string())
            .collect()
    }

    /// The names the component exports.
    pub fn exports(&self) -> Vec<String> {
        self.component
            .component_type()
            .exports(&self.engine)
            .map(|(name, _)| name.to_string())
            .collect()
    }

    fn instance(&mut self) -> Result<&mut (Store<()>, bindings::Policy), EngineError> {
        if self.live.is_none() {
            let mut store = Store::new(&self.engine, ());
            let policy =
                bindings::Policy::instantiate(&mut store, &self.component, &self.linker).map_err(EngineError::Load)?;
            self.live = Some((store, policy));
        }
        match self.live.as_mut() {
            Some(live) => Ok(live),
            None => unreachable!("instance was just created"),
        }
    }

    /// Run one call; a trap poisons the instance, so drop it.
    pub fn call<T>(
        &mut self,
        f: impl FnOnce(&wit::Guest, &mut Store<()>) -> wasmtime::Result<T>,
    ) -> Result<T, EngineError> {
        let (store, policy) = self.instance()?;
        let result = f(policy.turnsafe_policy_engine(), store);
        result.map_err(|e| {
            self.live = None;
            EngineError::Trap(e)
        })
    }
}

impl PolicyEngine for WasmEngine {
    fn classify_json(&mut self, observation: &str) -> Result<String, EngineError> {
        self.call(|g, s| g.call_classify_json(s, observation))
    }
    fn explain_json(&mut self, request: &str) -> Result<String, EngineError> {
        self.call(|g, s| g.call_explain_json(s, request))
    }
    fn evaluate_json(&mut self, request: &str) -> Result<String, EngineError> {
        self.call(|g, s| g.call_evaluate_json(s, request))
    }
    fn flush_step_json(&mut self, request: &str) -> Result<String, EngineError> {
        self.call(|g, s| g.call_flush_step_json(s, request))
    }
    fn edit_step_json(&mut self, request: &str) -> Result<String, EngineError> {
        self.call(|g, s| g.call_edit_step_json(s, request))
    }
    fn decide_lease_json(&mut self, request: &str) -> Result<String, EngineError> {
        self.call(|g, s| g.call_decide_lease_json(s, request))
    }
    fn decide_scope_json(&mut self, request: &str) -> Result<String, EngineError> {
        self.call(|g, s| g.call_decide_scope_json(s, request))
    }
}

/// An engine of the requested kind.
pub fn open(kind: EngineKind) -> Result<Box<dyn PolicyEngine>, EngineError> {
    Ok(match kind {
        EngineKind::Native => Box::new(NativeEngine),
        EngineKind::Wasm => Box::new(WasmEngine::new()?),
    })
}
