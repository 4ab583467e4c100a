//! Panics in code we do not control (a handler, a rule, a damaged file inside redb) are
//! contained where they happen; these helpers turn them into errors with their message.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

/// The message a panic was raised with, or a placeholder if it carried something else.
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(message) = payload.downcast_ref::<&str>() {
        message.to_string()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// Serialises hook swaps: two overlapping swaps could leave the quiet hook installed.
static HOOK_SWAP: Mutex<()> = Mutex::new(());

/// Runs `f`, catching a panic without printing it: for a panic the caller reports as an
/// error itself (a damaged store file makes redb panic at open). `f` must not wait on
/// another thread that calls `quietly`: the hook swap is serialised, so that would deadlock.
pub fn quietly<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    let _swap = HOOK_SWAP.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    result
}
