//! The string functions of libibverbs.

use std::ffi::c_char;

macro_rules! cstr {
    ($s:expr) => {
        concat!($s, "\0").as_ptr() as *const c_char
    };
}

#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: u32) -> *const c_char {
    match uroce::ib::WcStatus::from_raw(status) {
        Some(s) => {
            // One static NUL-terminated string per status.
            static TABLE: std::sync::OnceLock<Vec<std::ffi::CString>> = std::sync::OnceLock::new();
            let t = TABLE.get_or_init(|| {
                (0..=23)
                    .map(|i| std::ffi::CString::new(uroce::ib::WcStatus::from_raw(i).unwrap().as_str()).unwrap())
                    .collect()
            });
            t[s as usize].as_ptr()
        }
        None => cstr!("unknown"),
    }
}

#[no_mangle]
pub extern "C" fn ibv_node_type_str(t: i32) -> *const c_char {
    match t {
        1 => cstr!("InfiniBand channel adapter"),
        2 => cstr!("InfiniBand switch"),
        3 => cstr!("InfiniBand router"),
        4 => cstr!("iWARP NIC"),
        5 => cstr!("usNIC"),
        6 => cstr!("usNIC UDP"),
        7 => cstr!("unspecified"),
        _ => cstr!("unknown"),
    }
}

#[no_mangle]
pub extern "C" fn ibv_port_state_str(s: u32) -> *const c_char {
    match s {
        0 => cstr!("PORT_NOP"),
        1 => cstr!("PORT_DOWN"),
        2 => cstr!("PORT_INIT"),
        3 => cstr!("PORT_ARMED"),
        4 => cstr!("PORT_ACTIVE"),
        5 => cstr!("PORT_ACTIVE_DEFER"),
        _ => cstr!("invalid state"),
    }
}

#[no_mangle]
pub extern "C" fn ibv_event_type_str(e: u32) -> *const c_char {
    const N: [&str; 20] = [
        "CQ error\0",
        "local work queue catastrophic error\0",
        "invalid request local work queue error\0",
        "local access violation work queue error\0",
        "communication established\0",
        "send queue drained\0",
        "path migrated\0",
        "path migration request error\0",
        "local catastrophic error\0",
        "port active\0",
        "port error\0",
        "LID change\0",
        "P_Key change\0",
        "SM change\0",
        "SRQ catastrophic error\0",
        "SRQ limit reached\0",
        "last WQE reached\0",
        "client reregistration\0",
        "GID table change\0",
        "WQ fatal\0",
    ];
    N.get(e as usize).map_or(cstr!("unknown"), |s| s.as_ptr() as *const c_char)
}

/// IB rate enum → multiple of 2.5 Gb/s.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: u32) -> i32 {
    match rate {
        2 => 1,
        5 => 2,
        3 => 4,
        6 => 8,
        7 => 12,
        8 => 16,
        9 => 24,
        4 => 32,
        10 => 48,
        _ => -1,
    }
}

#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: i32) -> u32 {
    match mult {
        1 => 2,
        2 => 5,
        4 => 3,
        8 => 6,
        12 => 7,
        16 => 8,
        24 => 9,
        32 => 4,
        48 => 10,
        _ => 0,
    }
}

#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: u32) -> i32 {
    ibv_rate_to_mult(rate).max(0) * 2500
}

#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: i32) -> u32 {
    mult_to_ibv_rate(mbps / 2500)
}
