//! The `overflow` property: what the element does when a cue's speech is longer than its slot (or,
//! live, when its audio is late), and what it reports it did.

use gst::glib;

/// The `overflow` property (nicks as gst-plugins-rs' `awspolly` and `elevenlabssynthesizer` name
/// them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, glib::Enum)]
#[repr(u32)]
#[enum_type(name = "GstOmniTtsSynthOverflow")]
pub enum Overflow {
    /// Cut the speech at the end of its slot, with a short fade-out.
    #[default]
    #[enum_value(
        name = "Clip: cut the speech at the end of its slot (PTS + duration), with a 10 ms fade-out",
        nick = "clip"
    )]
    Clip = 0,
    /// Let the speech run on; later cues still start at their PTS, mixed with it.
    #[enum_value(
        name = "Overlap: the speech runs past its slot, mixed with later cues at their PTS",
        nick = "overlap"
    )]
    Overlap = 1,
    /// Let the speech run on; later cues start after it (never earlier than their PTS).
    #[enum_value(
        name = "Shift: the speech runs past its slot; later cues start when it ends",
        nick = "shift"
    )]
    Shift = 2,
    /// Time-compress the speech into its slot (pitch kept), by at most `max-compression`; what is
    /// still too long is then cut at its slot's end as `clip` does.
    #[enum_value(
        name = "Compress: sped up into its slot (pitch kept, max-compression), then clipped",
        nick = "compress"
    )]
    Compress = 3,
}

impl Overflow {
    /// The property value's nick: `clip`, `overlap`, `shift`, `compress`.
    pub fn nick(self) -> &'static str {
        match self {
            Overflow::Clip => "clip",
            Overflow::Overlap => "overlap",
            Overflow::Shift => "shift",
            Overflow::Compress => "compress",
        }
    }

    /// Whether a cue is cut at its slot's end (`clip`, and `compress` for what compressing by
    /// at most `max-compression` does not fit).
    pub fn cuts(self) -> bool {
        matches!(self, Overflow::Clip | Overflow::Compress)
    }
}

/// What the overflow policy did with one cue (the `action` field of the cue message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The cue had nothing to speak (empty, whitespace, no letter or digit), or its synthesis
    /// ended without audio (it failed): its slot is silence.
    Silent,
    /// Spoken at its PTS, within its slot (or it had no slot end).
    Fit,
    /// Cut at its slot's end (`clip`, `compress`), possibly to nothing when, live, its audio
    /// could not start before it (late).
    Clipped,
    /// Ran past its slot's end, mixed with whatever starts there (`overlap`).
    Overlapped,
    /// Ran past its slot's end; the cues after it are shifted (`shift`).
    Overran,
    /// Started after its PTS because the speech before it ran long (`shift`).
    Shifted,
    /// Sped up into its slot, pitch kept (`compress`).
    Compressed,
    /// Playing when a flush (a flushing seek) dropped it: its output ends where the flush came.
    Flushed,
}

impl Action {
    /// The name in the cue message: `silent`, `fit`, `clipped`, `overlapped`, `overran`,
    /// `shifted`, `compressed`, `flushed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Silent => "silent",
            Action::Fit => "fit",
            Action::Clipped => "clipped",
            Action::Overlapped => "overlapped",
            Action::Overran => "overran",
            Action::Shifted => "shifted",
            Action::Compressed => "compressed",
            Action::Flushed => "flushed",
        }
    }
}
