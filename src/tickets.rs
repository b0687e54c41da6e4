//! Ticket arbitration (pure).
