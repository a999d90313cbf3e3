//! The engine's output other than packets: asynchronous events
//! (`ibv_async_event`) and completion notifications.

use crate::ib::AsyncEventType;

/// What an asynchronous event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventElement {
    /// A queue pair, by QP number.
    Qp(u32),
    /// A completion queue, by its handle.
    Cq(u32),
    /// A shared receive queue, by SRQ number.
    Srq(u32),
    /// A port, by number (1 on uroce).
    Port(u8),
}

/// `struct ibv_async_event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// What happened (`event_type`).
    pub kind: AsyncEventType,
    /// To what (`element`).
    pub element: EventElement,
}

impl AsyncEvent {
    /// An event of QP `qpn`.
    pub fn qp(kind: AsyncEventType, qpn: u32) -> Self {
        AsyncEvent { kind, element: EventElement::Qp(qpn) }
    }
    /// An event of CQ `cq`.
    pub fn cq(kind: AsyncEventType, cq: u32) -> Self {
        AsyncEvent { kind, element: EventElement::Cq(cq) }
    }
    /// An event of SRQ `srq`.
    pub fn srq(kind: AsyncEventType, srq: u32) -> Self {
        AsyncEvent { kind, element: EventElement::Srq(srq) }
    }
}

/// Output of the engine other than packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Async(AsyncEvent),
    /// An armed completion queue got a completion: signal its channel.
    CompletionNotify(u32),
}
