//! A streaming YAML decoder: a [`serde::Deserializer`] that pulls libyaml's events one at a time.
//!
//! `serde_yaml_ng` first stores every event of a document (each scalar's text copied out) and
//! only then decodes: a 9.4 MB manifest of 96,000 env vars cost 100.7 MB of events before its
//! first field was decoded. This decoder holds the event it is reading and nothing more of the
//! document (plus, per level of nesting, the current map key, for error paths), so a manifest
//! costs about its own text and what it decodes into.
//!
//! For every document it accepts, it decodes exactly as `serde_yaml_ng` 0.10 does (its
//! `Deserializer::from_str` on one document): the same resolution of plain scalars (`~`, `null`
//! and the empty scalar are null; `true`/`True`/`TRUE` and the false forms are booleans;
//! integers in decimal, `0x`, `0o` and `0b` with signs, `0777` a string; floats with `.inf`
//! and `.nan`), quoted scalars always strings, a plain empty scalar read as an empty list or
//! map, unit enum variants from scalars, the recursion limit of [`depth::MAX_DEPTH`] levels,
//! and the same error messages, paths (`spec.containers[0].image`) and locations.
//!
//! Some YAML it does not decode, returning an error for which [`Error::unsupported`] says what
//! it met, rather than guessing at a result:
//!
//! - aliases (`*name`): resolving one means keeping the anchored node's events, which is what
//!   this decoder exists not to do (anchors alone are accepted and ignored);
//! - explicit tags (`!name`, `!!str`): `serde_yaml_ng` gives them meanings of its own (enum
//!   variants, typed scalars);
//! - a stream with no document, or with more than one.
//!
//! The manifest decoder then falls back to `serde_yaml_ng` for manifests of at most
//! [`FALLBACK_MAX`] bytes, so small manifests with these decode (or fail) as they always did,
//! its own limit on alias expansion included; a larger one is refused with an error naming what
//! is not supported (the same pod as JSON, or as YAML without them, is accepted).

use std::ffi::CStr;
use std::fmt;
use std::mem::MaybeUninit;

use serde::de::{self, DeserializeSeed, Expected, IgnoredAny, Unexpected, Visitor};
use unsafe_libyaml as unsafe_sys;

use super::depth;

/// Largest YAML manifest that is decoded again by `serde_yaml_ng` when it holds something this
/// decoder does not support; the events of 1 MiB of YAML stay within the agent's memory budget.
pub(crate) const FALLBACK_MAX: usize = 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// The libyaml parser.

/// A libyaml event parser over borrowed text.
pub(crate) struct Parser<'a> {
    /// Boxed: libyaml keeps a pointer to the parser in the parser (its read handler's data).
    raw: Box<MaybeUninit<unsafe_sys::yaml_parser_t>>,
    text: &'a str,
}

impl<'a> Parser<'a> {
    /// `None` if libyaml cannot allocate its buffers.
    pub(crate) fn new(text: &'a str) -> Option<Self> {
        let mut raw = Box::new(MaybeUninit::<unsafe_sys::yaml_parser_t>::uninit());
        let ptr = raw.as_mut_ptr();
        // SAFETY: `ptr` points to memory for a parser, which initialize fills in; on failure
        // libyaml has freed what it allocated and the parser is never used.
        if unsafe { unsafe_sys::yaml_parser_initialize(ptr) }.fail {
            return None;
        }
        let parser = Parser { raw, text };
        // SAFETY: the parser is initialized and boxed (it does not move); the input outlives it
        // (`'a`), and libyaml only reads `text.len()` bytes from its start. The text is a `str`,
        // so UTF-8 is its encoding (stated rather than detected, as serde_yaml_ng does; for
        // UTF-8 text the two agree).
        unsafe {
            unsafe_sys::yaml_parser_set_encoding(ptr, unsafe_sys::YAML_UTF8_ENCODING);
            unsafe_sys::yaml_parser_set_input_string(ptr, text.as_ptr(), text.len() as u64);
        }
        Some(parser)
    }

    /// The text being parsed.
    pub(crate) fn text(&self) -> &'a str {
        self.text
    }

    /// The next event. After a syntax error, every call returns that error again.
    pub(crate) fn next(&mut self) -> Result<Event, SyntaxError> {
        let parser = self.raw.as_mut_ptr();
        // SAFETY: the parser is initialized (`new` returns none otherwise) and nothing else
        // uses it while the reference lives; its error field is plain data.
        let error = unsafe { &*parser }.error;
        if error != unsafe_sys::YAML_NO_ERROR {
            // SAFETY: as above; the parser has an error to read.
            return Err(unsafe { SyntaxError::of(parser) });
        }
        let mut event = MaybeUninit::<unsafe_sys::yaml_event_t>::uninit();
        // SAFETY: the parser is initialized with its input set; parse fills in `event` when it
        // succeeds, and leaves nothing to free when it fails.
        if unsafe { unsafe_sys::yaml_parser_parse(parser, event.as_mut_ptr()) }.fail {
            // SAFETY: the parse failed, so the parser holds its error.
            return Err(unsafe { SyntaxError::of(parser) });
        }
        #[cfg(test)]
        live::born();
        // SAFETY: a successful parse initialized the event; `Event` owns it from here and
        // deletes it once, when dropped.
        Ok(Event {
            raw: unsafe { event.assume_init() },
        })
    }
}

impl Drop for Parser<'_> {
    fn drop(&mut self) {
        // SAFETY: the parser was initialized (`new` returns none otherwise) and is deleted once.
        unsafe { unsafe_sys::yaml_parser_delete(self.raw.as_mut_ptr()) }
    }
}

/// A position in the text: byte index, 0-based line and column (in characters), as libyaml
/// counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Mark {
    pub(crate) index: usize,
    pub(crate) line: usize,
    pub(crate) column: usize,
}

impl Mark {
    fn of(mark: unsafe_sys::yaml_mark_t) -> Self {
        let at = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        Mark {
            index: at(mark.index),
            line: at(mark.line),
            column: at(mark.column),
        }
    }

    /// libyaml leaves marks at line 0, column 0 unset; messages then say no place.
    fn is_set(self) -> bool {
        self.line != 0 || self.column != 0
    }
}

impl fmt::Display for Mark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_set() {
            write!(f, "line {} column {}", self.line + 1, self.column + 1)
        } else {
            write!(f, "position {}", self.index)
        }
    }
}

/// One event, owned: its scalar text and anchor are freed when it is dropped.
pub(crate) struct Event {
    raw: unsafe_sys::yaml_event_t,
}

/// How a scalar was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    Plain,
    SingleQuoted,
    DoubleQuoted,
    /// Literal (`|`) or folded (`>`) block scalars.
    Block,
}

impl Event {
    pub(crate) fn kind(&self) -> unsafe_sys::yaml_event_type_t {
        self.raw.type_
    }

    /// Where the event starts.
    pub(crate) fn start(&self) -> Mark {
        Mark::of(self.raw.start_mark)
    }

    fn end(&self) -> Mark {
        Mark::of(self.raw.end_mark)
    }

    /// A scalar's text and style; `None` for other events.
    fn scalar(&self) -> Option<(&[u8], Style)> {
        if self.kind() != unsafe_sys::YAML_SCALAR_EVENT {
            return None;
        }
        // SAFETY: the event is a scalar, so `scalar` is the union's live field.
        let scalar = unsafe { self.raw.data.scalar };
        let len = usize::try_from(scalar.length).ok()?;
        let value: &[u8] = if len == 0 || scalar.value.is_null() {
            &[]
        } else {
            // SAFETY: libyaml allocated `length` bytes of value for the event, which owns them
            // until it is dropped; the slice borrows the event.
            unsafe { std::slice::from_raw_parts(scalar.value, len) }
        };
        let style = match scalar.style {
            unsafe_sys::YAML_SINGLE_QUOTED_SCALAR_STYLE => Style::SingleQuoted,
            unsafe_sys::YAML_DOUBLE_QUOTED_SCALAR_STYLE => Style::DoubleQuoted,
            unsafe_sys::YAML_LITERAL_SCALAR_STYLE | unsafe_sys::YAML_FOLDED_SCALAR_STYLE => {
                Style::Block
            }
            _ => Style::Plain,
        };
        Some((value, style))
    }

    /// What in this event the decoder does not support: an alias, or a node with a tag.
    fn unsupported(&self) -> Option<Unsupported> {
        // SAFETY: each arm reads the union field that is live for the event's type.
        let tag = unsafe {
            match self.kind() {
                unsafe_sys::YAML_ALIAS_EVENT => return Some(Unsupported::Alias),
                unsafe_sys::YAML_SCALAR_EVENT => self.raw.data.scalar.tag,
                unsafe_sys::YAML_SEQUENCE_START_EVENT => self.raw.data.sequence_start.tag,
                unsafe_sys::YAML_MAPPING_START_EVENT => self.raw.data.mapping_start.tag,
                _ => return None,
            }
        };
        (!tag.is_null()).then_some(Unsupported::Tag)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        #[cfg(test)]
        live::died();
        // SAFETY: the event was filled in by a successful parse and is deleted once.
        unsafe { unsafe_sys::yaml_event_delete(&mut self.raw) }
    }
}

/// A libyaml syntax error: its problem and context, with where each was found.
#[derive(Debug, Clone)]
pub(crate) struct SyntaxError {
    problem: String,
    problem_offset: u64,
    problem_mark: Mark,
    context: Option<String>,
    context_mark: Mark,
}

impl SyntaxError {
    /// # Safety
    /// `parser` is an initialized parser whose last parse failed.
    unsafe fn of(parser: *const unsafe_sys::yaml_parser_t) -> Self {
        let text = |p: *const std::ffi::c_char| {
            // SAFETY: libyaml's problem and context are null or point to its static,
            // NUL-terminated messages.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        // SAFETY: the caller passes an initialized parser; these fields are plain data.
        let p = unsafe { &*parser };
        SyntaxError {
            problem: text(p.problem.cast())
                .unwrap_or_else(|| "libyaml parser failed but there is no error".to_owned()),
            problem_offset: p.problem_offset,
            problem_mark: Mark::of(p.problem_mark),
            context: text(p.context.cast()),
            context_mark: Mark::of(p.context_mark),
        }
    }
}

impl fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.problem)?;
        if self.problem_mark.is_set() {
            write!(f, " at {}", self.problem_mark)?;
        } else if self.problem_offset != 0 {
            write!(f, " at position {}", self.problem_offset)?;
        }
        if let Some(context) = &self.context {
            write!(f, ", {context}")?;
            let (c, p) = (self.context_mark, self.problem_mark);
            if c.is_set() && (c.line, c.column) != (p.line, p.column) {
                write!(f, " at {c}")?;
            }
        }
        Ok(())
    }
}

/// Events alive at once on this thread, for the tests that check the decoder streams.
#[cfg(test)]
pub(crate) mod live {
    use std::cell::Cell;

    thread_local! {
        static NOW: Cell<usize> = const { Cell::new(0) };
        static MOST: Cell<usize> = const { Cell::new(0) };
        static TOTAL: Cell<usize> = const { Cell::new(0) };
    }

    pub(super) fn born() {
        let now = NOW.get() + 1;
        NOW.set(now);
        MOST.set(MOST.get().max(now));
        TOTAL.set(TOTAL.get() + 1);
    }

    pub(super) fn died() {
        NOW.set(NOW.get().saturating_sub(1));
    }

    /// Starts counting afresh.
    pub(crate) fn reset() {
        MOST.set(NOW.get());
        TOTAL.set(0);
    }

    /// The most events alive at once, and how many were parsed, since [`reset`].
    pub(crate) fn counts() -> (usize, usize) {
        (MOST.get(), TOTAL.get())
    }
}

// ---------------------------------------------------------------------------------------------
// Errors.

/// What the decoder met and does not support (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unsupported {
    Alias,
    Tag,
    NoDocument,
    MoreThanOneDocument,
}

impl Unsupported {
    /// What was met, in the plural, as the subject of a sentence.
    pub(crate) fn what(self) -> &'static str {
        match self {
            Unsupported::Alias => "aliases (*name)",
            Unsupported::Tag => "tags (!name)",
            Unsupported::NoDocument => "files of no YAML document",
            Unsupported::MoreThanOneDocument => "files of more than one YAML document",
        }
    }
}

/// A decoding error: a message, and where (1-based line and column) if known.
pub(crate) struct Error(Box<ErrorKind>);

#[derive(Debug)]
enum ErrorKind {
    /// A visitor's message, given the event (and its path) it was decoding from.
    Message(String, Option<(Mark, String)>),
    Syntax(SyntaxError),
    Recursion(Mark),
    Bytes,
    Unsupported(Unsupported, Mark),
}

impl Error {
    fn new(kind: ErrorKind) -> Self {
        Error(Box::new(kind))
    }

    fn mark(&self) -> Option<Mark> {
        match &*self.0 {
            ErrorKind::Message(_, Some((mark, _)))
            | ErrorKind::Recursion(mark)
            | ErrorKind::Unsupported(_, mark) => Some(*mark),
            ErrorKind::Syntax(e) => Some(e.problem_mark),
            ErrorKind::Message(_, None) | ErrorKind::Bytes => None,
        }
    }

    /// 1-based line of the error, if known.
    pub(crate) fn line(&self) -> Option<usize> {
        self.mark().map(|m| m.line.saturating_add(1))
    }

    /// 1-based column of the error, if known.
    pub(crate) fn column(&self) -> Option<usize> {
        self.mark().map(|m| m.column.saturating_add(1))
    }

    /// The message, with the path and place it applies to (as displayed).
    pub(crate) fn message(&self) -> String {
        self.to_string()
    }

    /// What the text holds that this decoder does not support, if that is the error.
    pub(crate) fn unsupported(&self) -> Option<Unsupported> {
        match &*self.0 {
            ErrorKind::Unsupported(what, _) => Some(*what),
            _ => None,
        }
    }

    /// Gives a visitor's message the place it applies to, unless it has one already (the
    /// innermost node's place wins).
    fn at(mut self, mark: Mark, path: &Path<'_>) -> Self {
        if let ErrorKind::Message(_, place @ None) = &mut *self.0 {
            *place = Some((mark, path.to_string()));
        }
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.0 {
            ErrorKind::Syntax(e) => return fmt::Display::fmt(e, f),
            ErrorKind::Message(message, place) => {
                if let Some((_, path)) = place
                    && path != "."
                {
                    write!(f, "{path}: ")?;
                }
                f.write_str(message)?;
            }
            ErrorKind::Recursion(_) => f.write_str("recursion limit exceeded")?,
            ErrorKind::Bytes => f.write_str(
                "serialization and deserialization of bytes in YAML is not implemented",
            )?,
            ErrorKind::Unsupported(what, _) => write!(
                f,
                "{}: not supported by the streaming YAML decoder",
                what.what()
            )?,
        }
        match self.mark() {
            Some(mark) if mark.is_set() => write!(f, " at {mark}"),
            _ => Ok(()),
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Error({:?}, line: {:?}, column: {:?})",
            self.to_string(),
            self.line(),
            self.column()
        )
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error::new(ErrorKind::Message(msg.to_string(), None))
    }
}

type Result<T, E = Error> = std::result::Result<T, E>;

// ---------------------------------------------------------------------------------------------
// Decoding.

/// Decodes the one document of `text` through `seed`.
pub(crate) fn from_str_seed<'de, S: DeserializeSeed<'de>>(
    text: &'de str,
    seed: S,
) -> Result<S::Value> {
    let parser =
        Parser::new(text).ok_or_else(|| de::Error::custom("cannot allocate the YAML parser"))?;
    let mut stream = Stream {
        parser,
        peeked: None,
        unsupported: None,
    };
    // The stream's start, then the first document's. A syntax error on the way is the
    // document's: the parser repeats it to the first read of the document, as serde_yaml_ng
    // reports it (a read that fails before reading, bytes, fails with its own error).
    loop {
        match stream.next() {
            Ok(event) => match event.kind() {
                unsafe_sys::YAML_STREAM_START_EVENT => {}
                unsafe_sys::YAML_DOCUMENT_START_EVENT => break,
                _ => {
                    return Err(Error::new(ErrorKind::Unsupported(
                        Unsupported::NoDocument,
                        event.start(),
                    )));
                }
            },
            Err(e) if e.unsupported().is_none() => break,
            Err(e) => return Err(e),
        }
    }
    let value = seed.deserialize(&mut De {
        stream: &mut stream,
        path: Path::Root,
        remaining_depth: depth::MAX_DEPTH,
    });
    // A visitor may have dropped the error; what was met still decides.
    if let Some((what, mark)) = stream.unsupported {
        return Err(Error::new(ErrorKind::Unsupported(what, mark)));
    }
    let value = value?;
    // The document's end: a syntax error before it is the document's.
    let end = stream.next()?;
    if end.kind() != unsafe_sys::YAML_DOCUMENT_END_EVENT {
        return Err(de::Error::custom("expected the end of the YAML document"));
    }
    drop(end);
    // Anything but the stream's end (another document, or an error after this one) is a
    // second document.
    match stream.next() {
        Ok(event) if event.kind() == unsafe_sys::YAML_STREAM_END_EVENT => Ok(value),
        Ok(event) => Err(Error::new(ErrorKind::Unsupported(
            Unsupported::MoreThanOneDocument,
            event.start(),
        ))),
        Err(e) => Err(Error::new(ErrorKind::Unsupported(
            Unsupported::MoreThanOneDocument,
            e.mark().unwrap_or_default(),
        ))),
    }
}

/// Decodes the one document of `text` as a `T`.
#[cfg(test)]
pub(crate) fn from_str<'de, T: serde::Deserialize<'de>>(text: &'de str) -> Result<T> {
    from_str_seed(text, std::marker::PhantomData::<T>)
}

/// The parser, with at most one event read ahead.
struct Stream<'de> {
    parser: Parser<'de>,
    peeked: Option<Event>,
    /// The first unsupported event met: every read after it fails with it.
    unsupported: Option<(Unsupported, Mark)>,
}

impl<'de> Stream<'de> {
    fn pull(&mut self) -> Result<Event> {
        if let Some((what, mark)) = self.unsupported {
            return Err(Error::new(ErrorKind::Unsupported(what, mark)));
        }
        let event = self
            .parser
            .next()
            .map_err(|e| Error::new(ErrorKind::Syntax(e)))?;
        if let Some(what) = event.unsupported() {
            let mark = event.start();
            self.unsupported = Some((what, mark));
            return Err(Error::new(ErrorKind::Unsupported(what, mark)));
        }
        Ok(event)
    }

    fn peek(&mut self) -> Result<&Event> {
        if self.peeked.is_none() {
            self.peeked = Some(self.pull()?);
        }
        match &self.peeked {
            Some(event) => Ok(event),
            None => Err(de::Error::custom("no YAML event")),
        }
    }

    fn next(&mut self) -> Result<Event> {
        match self.peeked.take() {
            Some(event) => Ok(event),
            None => self.pull(),
        }
    }
}

/// Where a node is in the document, for error messages: `spec.containers[0].image`.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root,
    Seq {
        parent: &'a Path<'a>,
        index: usize,
    },
    Map {
        parent: &'a Path<'a>,
        key: &'a str,
    },
    /// A value whose key is not a string.
    Unknown {
        parent: &'a Path<'a>,
    },
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A child's prefix: nothing under the root, else the parent and a dot.
        struct Prefix<'p>(&'p Path<'p>);
        impl fmt::Display for Prefix<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.0 {
                    Path::Root => Ok(()),
                    parent => write!(f, "{parent}."),
                }
            }
        }
        match self {
            Path::Root => f.write_str("."),
            Path::Seq { parent, index } => write!(f, "{parent}[{index}]"),
            Path::Map { parent, key } => write!(f, "{}{key}", Prefix(parent)),
            Path::Unknown { parent } => write!(f, "{}?", Prefix(parent)),
        }
    }
}

/// The decoder at one node of the document.
struct De<'de, 'a> {
    stream: &'a mut Stream<'de>,
    path: Path<'a>,
    /// Collections (and newtypes) that may still nest below this node.
    remaining_depth: usize,
}

// Scalar resolution: the rules of serde_yaml_ng 0.10 for untagged scalars.

fn is_null(v: &[u8]) -> bool {
    matches!(v, b"null" | b"Null" | b"NULL" | b"~")
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// Digits with a leading zero (`0777`, `-012`) are a string, not an octal or decimal number.
fn leading_zero_digits(v: &str) -> bool {
    let digits = v.strip_prefix(['+', '-']).unwrap_or(v);
    let mut bytes = digits.bytes();
    bytes.next() == Some(b'0') && digits.len() > 1 && bytes.all(|b| b.is_ascii_digit())
}

/// Integer types read from scalars.
trait Int: Sized {
    fn radix(digits: &str, radix: u32) -> Option<Self>;
}

macro_rules! int {
    ($($t:ty)*) => {$(
        impl Int for $t {
            fn radix(digits: &str, radix: u32) -> Option<Self> {
                <$t>::from_str_radix(digits, radix).ok()
            }
        }
    )*};
}
int!(u64 i64 u128 i128);

const RADIXES: [(&str, u32); 3] = [("0x", 16), ("0o", 8), ("0b", 2)];

/// `unsigned` read in `radix` after `prefix`: `Some(None)` when a sign follows the prefix (not
/// a number at all), `Some(Some(n))` when the digits are a number, `None` otherwise (read on).
fn prefixed<T: Int>(unsigned: &str, prefix: &str, radix: u32) -> Option<Option<T>> {
    let digits = unsigned.strip_prefix(prefix)?;
    if digits.starts_with(['+', '-']) {
        return Some(None);
    }
    T::radix(digits, radix).map(Some)
}

/// A non-negative integer: decimal, or `0x`/`0o`/`0b`, with an optional `+`.
fn parse_unsigned<T: Int>(v: &str) -> Option<T> {
    let unsigned = v.strip_prefix('+').unwrap_or(v);
    for (prefix, radix) in RADIXES {
        if let Some(read) = prefixed(unsigned, prefix, radix) {
            return read;
        }
    }
    if unsigned.starts_with(['+', '-']) || leading_zero_digits(v) {
        return None;
    }
    T::radix(unsigned, 10)
}

/// An integer of either sign, as a signed field reads it.
fn parse_signed<T: Int>(v: &str) -> Option<T> {
    let unsigned = match v.strip_prefix('+') {
        Some(rest) if rest.starts_with(['+', '-']) => return None,
        Some(rest) => rest,
        None => v,
    };
    for (prefix, radix) in RADIXES {
        if unsigned.starts_with(prefix) {
            if let Some(read) = prefixed(unsigned, prefix, radix) {
                return read;
            }
        } else if let Some(n) = negative_radix(v, prefix, radix) {
            return Some(n);
        }
    }
    if leading_zero_digits(v) {
        return None;
    }
    T::radix(unsigned, 10)
}

/// `-0x1F` and the like.
fn negative_radix<T: Int>(v: &str, prefix: &str, radix: u32) -> Option<T> {
    let digits = v.strip_prefix('-')?.strip_prefix(prefix)?;
    T::radix(&format!("-{digits}"), radix)
}

/// A negative integer (or any decimal one), as an untagged scalar is tried after the unsigned
/// reading.
fn parse_negative<T: Int>(v: &str) -> Option<T> {
    for (prefix, radix) in RADIXES {
        if let Some(n) = negative_radix(v, prefix, radix) {
            return Some(n);
        }
    }
    if leading_zero_digits(v) {
        return None;
    }
    T::radix(v, 10)
}

/// A finite float, or `.inf`, `-.inf`, `.nan` in their three spellings.
fn parse_float(v: &str) -> Option<f64> {
    let unsigned = match v.strip_prefix('+') {
        Some(rest) if rest.starts_with(['+', '-']) => return None,
        Some(rest) => rest,
        None => v,
    };
    if matches!(unsigned, ".inf" | ".Inf" | ".INF") {
        return Some(f64::INFINITY);
    }
    if matches!(v, "-.inf" | "-.Inf" | "-.INF") {
        return Some(f64::NEG_INFINITY);
    }
    if matches!(v, ".nan" | ".NaN" | ".NAN") {
        return Some(f64::NAN.copysign(1.0));
    }
    unsigned.parse::<f64>().ok().filter(|f| f.is_finite())
}

/// An untagged integer: `u64`, `i64`, `u128`, `i128`, the first that holds it. The visitor
/// comes back if the scalar is no integer.
fn visit_int<'de, V: Visitor<'de>>(visitor: V, v: &str) -> Result<Result<V::Value>, V> {
    if let Some(n) = parse_unsigned::<u64>(v) {
        Ok(visitor.visit_u64(n))
    } else if let Some(n) = parse_negative::<i64>(v) {
        Ok(visitor.visit_i64(n))
    } else if let Some(n) = parse_unsigned::<u128>(v) {
        Ok(visitor.visit_u128(n))
    } else if let Some(n) = parse_negative::<i128>(v) {
        Ok(visitor.visit_i128(n))
    } else {
        Err(visitor)
    }
}

/// A scalar's text to a visitor: borrowed from the input when it can be.
fn visit_text<'de, V: Visitor<'de>>(
    visitor: V,
    v: &str,
    borrowed: Option<&'de str>,
) -> Result<V::Value> {
    match borrowed {
        Some(b) => visitor.visit_borrowed_str(b),
        None => visitor.visit_str(v),
    }
}

/// A scalar as `deserialize_any` reads it: plain scalars resolve to null, booleans, numbers or
/// strings; any other style is a string.
fn visit_scalar<'de, V: Visitor<'de>>(
    visitor: V,
    value: &[u8],
    style: Style,
    borrowed: impl FnOnce(&str) -> Option<&'de str>,
) -> Result<V::Value> {
    let Ok(v) = std::str::from_utf8(value) else {
        return Err(de::Error::invalid_type(Unexpected::Bytes(value), &visitor));
    };
    if style != Style::Plain {
        return visit_text(visitor, v, borrowed(v));
    }
    if v.is_empty() || is_null(v.as_bytes()) {
        return visitor.visit_unit();
    }
    if let Some(b) = parse_bool(v) {
        return visitor.visit_bool(b);
    }
    let visitor = match visit_int(visitor, v) {
        Ok(visited) => return visited,
        Err(visitor) => visitor,
    };
    if !leading_zero_digits(v)
        && let Some(f) = parse_float(v)
    {
        return visitor.visit_f64(f);
    }
    visit_text(visitor, v, borrowed(v))
}

/// The error for a node that is not what `exp` expects, naming what the node is (a scalar by
/// what it resolves to).
fn invalid_type(event: &Event, exp: &dyn Expected) -> Error {
    enum Never {}
    struct Probe<'e>(&'e dyn Expected);
    impl<'de> Visitor<'de> for Probe<'_> {
        type Value = Never;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.fmt(f)
        }
    }
    match event.kind() {
        unsafe_sys::YAML_SEQUENCE_START_EVENT => de::Error::invalid_type(Unexpected::Seq, exp),
        unsafe_sys::YAML_MAPPING_START_EVENT => de::Error::invalid_type(Unexpected::Map, exp),
        _ => match event.scalar() {
            Some((value, style)) => match visit_scalar(Probe(exp), value, style, |_| None) {
                Ok(never) => match never {},
                Err(e) => e,
            },
            None => de::Error::custom("unexpected YAML event"),
        },
    }
}

/// A plain scalar's text, for the typed reads (bool, numbers), which take no other style.
fn plain(event: &Event) -> Option<&str> {
    match event.scalar() {
        Some((value, Style::Plain)) => std::str::from_utf8(value).ok(),
        _ => None,
    }
}

impl<'de> De<'de, '_> {
    /// Runs `f` one level deeper, failing at `mark` past the recursion limit.
    fn nested<T>(&mut self, mark: Mark, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let Some(below) = self.remaining_depth.checked_sub(1) else {
            return Err(Error::new(ErrorKind::Recursion(mark)));
        };
        let above = std::mem::replace(&mut self.remaining_depth, below);
        let result = f(self);
        self.remaining_depth = above;
        result
    }

    /// A sequence whose start event was read: its elements to the visitor, then the rest (if
    /// the visitor stopped early) skipped, and the end read.
    fn visit_sequence<V: Visitor<'de>>(&mut self, visitor: V, mark: Mark) -> Result<V::Value> {
        let (value, len) = self.nested(mark, |de| {
            let mut seq = SeqAccess {
                de,
                len: 0,
                empty: false,
            };
            let value = visitor.visit_seq(&mut seq)?;
            Ok((value, seq.len))
        })?;
        let mut rest = SeqAccess {
            de: self,
            len,
            empty: false,
        };
        while de::SeqAccess::next_element::<IgnoredAny>(&mut rest)?.is_some() {}
        let total = rest.len;
        let expected = Count(len, "sequence of", "element");
        self.close(unsafe_sys::YAML_SEQUENCE_END_EVENT, total, expected)?;
        Ok(value)
    }

    /// A sequence or a mapping (`start` is its start event) read by `full`, or a plain empty
    /// scalar read by `empty` as an empty one; anything else is the wrong type.
    fn collection<V: Visitor<'de>>(
        &mut self,
        visitor: V,
        start: unsafe_sys::yaml_event_type_t,
        full: impl FnOnce(&mut Self, V, Mark) -> Result<V::Value>,
        empty: impl FnOnce(&mut Self, V) -> Result<V::Value>,
    ) -> Result<V::Value> {
        let event = self.stream.next()?;
        let mark = event.start();
        if event.kind() == start {
            drop(event);
            full(self, visitor, mark)
        } else if let Some((b"", Style::Plain)) = event.scalar() {
            drop(event);
            empty(self, visitor)
        } else {
            Err(invalid_type(&event, &visitor))
        }
        .map_err(|e| e.at(mark, &self.path))
    }

    /// A mapping whose start event was read, as [`Self::visit_sequence`].
    fn visit_mapping<V: Visitor<'de>>(&mut self, visitor: V, mark: Mark) -> Result<V::Value> {
        let (value, len) = self.nested(mark, |de| {
            let mut map = MapAccess::new(de, false);
            let value = visitor.visit_map(&mut map)?;
            Ok((value, map.len))
        })?;
        let mut rest = MapAccess::new(self, false);
        rest.len = len;
        while de::MapAccess::next_entry::<IgnoredAny, IgnoredAny>(&mut rest)?.is_some() {}
        let total = rest.len;
        let expected = Count(len, "map containing", "entry");
        self.close(unsafe_sys::YAML_MAPPING_END_EVENT, total, expected)?;
        Ok(value)
    }

    /// Reads a collection's `end` event, after the visitor took `expected.0` of its `total`
    /// entries: entries it left unread are an error, as in `serde_yaml_ng`.
    fn close(
        &mut self,
        end: unsafe_sys::yaml_event_type_t,
        total: usize,
        expected: Count,
    ) -> Result<()> {
        self.expect_end(end)?;
        if total != expected.0 {
            return Err(de::Error::invalid_length(total, &expected));
        }
        Ok(())
    }

    fn expect_end(&mut self, kind: unsafe_sys::yaml_event_type_t) -> Result<()> {
        if self.stream.next()?.kind() == kind {
            Ok(())
        } else {
            Err(de::Error::custom("unexpected YAML event"))
        }
    }

    /// Skips one node, however deep.
    fn skip(&mut self) -> Result<()> {
        let mut open = 0usize;
        loop {
            match self.stream.next()?.kind() {
                unsafe_sys::YAML_SEQUENCE_START_EVENT | unsafe_sys::YAML_MAPPING_START_EVENT => {
                    open += 1
                }
                unsafe_sys::YAML_SEQUENCE_END_EVENT | unsafe_sys::YAML_MAPPING_END_EVENT => {
                    open = open.saturating_sub(1)
                }
                _ => {}
            }
            if open == 0 {
                return Ok(());
            }
        }
    }

    /// A scalar's borrowable text, if `event` is a scalar of the input.
    fn borrowed(
        &self,
        event: &Event,
        style: Style,
    ) -> impl FnOnce(&str) -> Option<&'de str> + use<'de> {
        let stream: &Stream<'de> = self.stream;
        let text = stream.parser.text();
        let (start, end) = (event.start().index, event.end().index);
        move |v: &str| {
            let repr = text.get(start..end)?;
            let end = match style {
                Style::Plain => repr.len(),
                Style::SingleQuoted | Style::DoubleQuoted => repr.len().checked_sub(1)?,
                Style::Block => return None,
            };
            let start = end.checked_sub(v.len())?;
            repr.get(start..end).filter(|written| *written == v)
        }
    }

    /// A typed read of a plain scalar: `parse` its text, or fail naming what the node is.
    fn typed<V: Visitor<'de>, T>(
        &mut self,
        visitor: V,
        parse: impl FnOnce(&str) -> Option<T>,
        visit: impl FnOnce(V, T) -> Result<V::Value>,
    ) -> Result<V::Value> {
        let event = self.stream.next()?;
        let mark = event.start();
        match plain(&event).and_then(parse) {
            Some(t) => visit(visitor, t),
            None => Err(invalid_type(&event, &visitor)),
        }
        .map_err(|e| e.at(mark, &self.path))
    }
}

/// "sequence of 1 element", "map containing 2 entries".
struct Count(usize, &'static str, &'static str);

impl Expected for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Count(n, what, one) = *self;
        match (n, one) {
            (1, _) => write!(f, "{what} 1 {one}"),
            (_, "entry") => write!(f, "{what} {n} entries"),
            _ => write!(f, "{what} {n} {one}s"),
        }
    }
}

struct SeqAccess<'s, 'de, 'a> {
    de: &'s mut De<'de, 'a>,
    len: usize,
    /// An empty plain scalar read as an empty sequence.
    empty: bool,
}

impl<'de> de::SeqAccess<'de> for SeqAccess<'_, 'de, '_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        if self.empty || self.de.stream.peek()?.kind() == unsafe_sys::YAML_SEQUENCE_END_EVENT {
            return Ok(None);
        }
        let mut element = De {
            stream: &mut *self.de.stream,
            path: Path::Seq {
                parent: &self.de.path,
                index: self.len,
            },
            remaining_depth: self.de.remaining_depth,
        };
        self.len += 1;
        seed.deserialize(&mut element).map(Some)
    }
}

struct MapAccess<'s, 'de, 'a> {
    de: &'s mut De<'de, 'a>,
    len: usize,
    /// An empty plain scalar read as an empty mapping.
    empty: bool,
    /// The current key's text if it is a scalar (for the value's path); its buffer is reused.
    key: Vec<u8>,
    key_is_scalar: bool,
}

impl<'s, 'de, 'a> MapAccess<'s, 'de, 'a> {
    fn new(de: &'s mut De<'de, 'a>, empty: bool) -> Self {
        MapAccess {
            de,
            len: 0,
            empty,
            key: Vec::new(),
            key_is_scalar: false,
        }
    }
}

impl<'de> de::MapAccess<'de> for MapAccess<'_, 'de, '_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        if self.empty {
            return Ok(None);
        }
        let event = self.de.stream.peek()?;
        if event.kind() == unsafe_sys::YAML_MAPPING_END_EVENT {
            return Ok(None);
        }
        self.key.clear();
        self.key_is_scalar = match event.scalar() {
            Some((value, _)) => {
                self.key.extend_from_slice(value);
                true
            }
            None => false,
        };
        self.len += 1;
        seed.deserialize(&mut *self.de).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        let key = self
            .key_is_scalar
            .then(|| std::str::from_utf8(&self.key).ok())
            .flatten();
        let parent = &self.de.path;
        let mut value = De {
            stream: &mut *self.de.stream,
            path: match key {
                Some(key) => Path::Map { parent, key },
                None => Path::Unknown { parent },
            },
            remaining_depth: self.de.remaining_depth,
        };
        seed.deserialize(&mut value)
    }
}

/// A unit variant named by a scalar.
struct UnitVariant<'s, 'de, 'a>(&'s mut De<'de, 'a>);

impl<'de> de::EnumAccess<'de> for UnitVariant<'_, 'de, '_> {
    type Error = Error;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self)> {
        Ok((seed.deserialize(&mut *self.0)?, self))
    }
}

impl<'de> de::VariantAccess<'de> for UnitVariant<'_, 'de, '_> {
    type Error = Error;

    fn unit_variant(self) -> Result<()> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, _: T) -> Result<T::Value> {
        Err(de::Error::invalid_type(
            Unexpected::UnitVariant,
            &"newtype variant",
        ))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _: usize, _: V) -> Result<V::Value> {
        Err(de::Error::invalid_type(
            Unexpected::UnitVariant,
            &"tuple variant",
        ))
    }

    fn struct_variant<V: Visitor<'de>>(self, _: &'static [&'static str], _: V) -> Result<V::Value> {
        Err(de::Error::invalid_type(
            Unexpected::UnitVariant,
            &"struct variant",
        ))
    }
}

/// Deserializer methods that read as another one does (`i8` as `i64`, a struct as a map), the
/// arguments of the given types ignored.
macro_rules! forward {
    ($($from:ident($($ignored:ty),*) => $to:ident;)+) => {
        $(
            fn $from<V: Visitor<'de>>(self, $(_: $ignored,)* visitor: V) -> Result<V::Value> {
                self.$to(visitor)
            }
        )+
    };
}

impl<'de> de::Deserializer<'de> for &mut De<'de, '_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let event = self.stream.next()?;
        let mark = event.start();
        match event.kind() {
            unsafe_sys::YAML_SEQUENCE_START_EVENT => {
                drop(event);
                self.visit_sequence(visitor, mark)
            }
            unsafe_sys::YAML_MAPPING_START_EVENT => {
                drop(event);
                self.visit_mapping(visitor, mark)
            }
            _ => match event.scalar() {
                Some((value, style)) => {
                    visit_scalar(visitor, value, style, self.borrowed(&event, style))
                }
                None => Err(de::Error::custom("unexpected YAML event")),
            },
        }
        .map_err(|e| e.at(mark, &self.path))
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.typed(visitor, parse_bool, V::visit_bool)
    }

    forward! {
        deserialize_i8() => deserialize_i64;
        deserialize_i16() => deserialize_i64;
        deserialize_i32() => deserialize_i64;
        deserialize_u8() => deserialize_u64;
        deserialize_u16() => deserialize_u64;
        deserialize_u32() => deserialize_u64;
        deserialize_f32() => deserialize_f64;
        deserialize_char() => deserialize_str;
        deserialize_string() => deserialize_str;
        deserialize_identifier() => deserialize_str;
        deserialize_unit_struct(&'static str) => deserialize_unit;
        deserialize_tuple(usize) => deserialize_seq;
        deserialize_tuple_struct(&'static str, usize) => deserialize_seq;
        deserialize_struct(&'static str, &'static [&'static str]) => deserialize_map;
    }

    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.typed(visitor, parse_signed::<i64>, V::visit_i64)
    }

    fn deserialize_i128<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.typed(visitor, parse_signed::<i128>, V::visit_i128)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.typed(visitor, parse_unsigned::<u64>, V::visit_u64)
    }

    fn deserialize_u128<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.typed(visitor, parse_unsigned::<u128>, V::visit_u128)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.typed(visitor, parse_float, V::visit_f64)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let event = self.stream.next()?;
        let mark = event.start();
        match event.scalar() {
            Some((value, style)) => match std::str::from_utf8(value) {
                Ok(v) => visit_text(visitor, v, self.borrowed(&event, style)(v)),
                Err(_) => Err(invalid_type(&event, &visitor)),
            },
            None => Err(invalid_type(&event, &visitor)),
        }
        .map_err(|e| e.at(mark, &self.path))
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Error::new(ErrorKind::Bytes))
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
        Err(Error::new(ErrorKind::Bytes))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let event = self.stream.peek()?;
        let some = match event.scalar() {
            Some((value, Style::Plain)) => !value.is_empty() && !is_null(value),
            Some(_) => true,
            None => match event.kind() {
                unsafe_sys::YAML_SEQUENCE_START_EVENT | unsafe_sys::YAML_MAPPING_START_EVENT => {
                    true
                }
                _ => return Err(de::Error::custom("unexpected YAML event")),
            },
        };
        if some {
            visitor.visit_some(self)
        } else {
            self.stream.next()?;
            visitor.visit_none()
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let event = self.stream.next()?;
        let mark = event.start();
        match event.scalar() {
            Some((value, style)) => {
                if style == Style::Plain && (value.is_empty() || is_null(value)) {
                    visitor.visit_unit()
                } else {
                    let found = match std::str::from_utf8(value) {
                        Ok(v) => Unexpected::Str(v),
                        Err(_) => Unexpected::Bytes(value),
                    };
                    Err(de::Error::invalid_value(found, &"null"))
                }
            }
            None => Err(invalid_type(&event, &visitor)),
        }
        .map_err(|e| e.at(mark, &self.path))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        let mark = self.stream.peek()?.start();
        self.nested(mark, |de| visitor.visit_newtype_struct(de))
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.collection(
            visitor,
            unsafe_sys::YAML_SEQUENCE_START_EVENT,
            |de, visitor, mark| de.visit_sequence(visitor, mark),
            |de, visitor| {
                visitor.visit_seq(SeqAccess {
                    de,
                    len: 0,
                    empty: true,
                })
            },
        )
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.collection(
            visitor,
            unsafe_sys::YAML_MAPPING_START_EVENT,
            |de, visitor, mark| de.visit_mapping(visitor, mark),
            |de, visitor| visitor.visit_map(MapAccess::new(de, true)),
        )
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        let event = self.stream.peek()?;
        let mark = event.start();
        let found = match event.kind() {
            unsafe_sys::YAML_SCALAR_EVENT => None,
            unsafe_sys::YAML_SEQUENCE_START_EVENT => Some(Unexpected::Seq),
            unsafe_sys::YAML_MAPPING_START_EVENT => Some(Unexpected::Map),
            _ => return Err(de::Error::custom("unexpected YAML event")),
        };
        match found {
            // Variants with content are named by tags, which this decoder does not support.
            Some(found) => Err(de::Error::invalid_type(
                found,
                &"a YAML tag starting with '!'",
            )),
            None => visitor.visit_enum(UnitVariant(&mut *self)),
        }
        .map_err(|e| e.at(mark, &self.path))
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.skip()?;
        visitor.visit_unit()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fmt::Debug;

    use k8s_openapi::api::core::v1::Pod;
    use serde::de::DeserializeOwned;
    use serde::{Deserialize, Deserializer};

    use super::*;

    /// What a visitor was given, as text: `u64:31`, `bstr:abc` (borrowed), `{k=v}`.
    #[derive(Debug, PartialEq)]
    struct Trace(String);

    impl<'de> Deserialize<'de> for Trace {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(Tracer).map(Trace)
        }
    }

    struct Tracer;

    impl<'de> Visitor<'de> for Tracer {
        type Value = String;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("anything")
        }
        fn visit_bool<E>(self, v: bool) -> Result<String, E> {
            Ok(format!("bool:{v}"))
        }
        fn visit_i64<E>(self, v: i64) -> Result<String, E> {
            Ok(format!("i64:{v}"))
        }
        fn visit_u64<E>(self, v: u64) -> Result<String, E> {
            Ok(format!("u64:{v}"))
        }
        fn visit_i128<E>(self, v: i128) -> Result<String, E> {
            Ok(format!("i128:{v}"))
        }
        fn visit_u128<E>(self, v: u128) -> Result<String, E> {
            Ok(format!("u128:{v}"))
        }
        fn visit_f64<E>(self, v: f64) -> Result<String, E> {
            Ok(format!("f64:{v}:{:x}", v.to_bits()))
        }
        fn visit_str<E>(self, v: &str) -> Result<String, E> {
            Ok(format!("str:{v}"))
        }
        fn visit_borrowed_str<E>(self, v: &'de str) -> Result<String, E> {
            Ok(format!("bstr:{v}"))
        }
        fn visit_unit<E>(self) -> Result<String, E> {
            Ok("unit".into())
        }
        fn visit_none<E>(self) -> Result<String, E> {
            Ok("none".into())
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
            Ok(format!("some({})", Trace::deserialize(d)?.0))
        }
        fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
            Ok(format!("newtype({})", Trace::deserialize(d)?.0))
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<String, A::Error> {
            let mut out = Vec::new();
            while let Some(Trace(t)) = seq.next_element()? {
                out.push(t);
            }
            Ok(format!("[{}]", out.join(",")))
        }
        fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
            let mut out = Vec::new();
            while let Some((Trace(k), Trace(v))) = map.next_entry()? {
                out.push(format!("{k}={v}"));
            }
            Ok(format!("{{{}}}", out.join(",")))
        }
        fn visit_enum<A: de::EnumAccess<'de>>(self, e: A) -> Result<String, A::Error> {
            let (Trace(variant), access) = e.variant::<Trace>()?;
            de::VariantAccess::unit_variant(access)?;
            Ok(format!("enum:{variant}"))
        }
    }

    /// Which `deserialize_*` the root is read with (its contents are read as [`Trace`]).
    #[derive(Debug, Clone, Copy)]
    enum Mode {
        Any,
        Bool,
        I64,
        I128,
        U64,
        U128,
        F64,
        Str,
        Option,
        Unit,
        Seq,
        Map,
        Tuple2,
        Newtype,
        Enum,
        Ignored,
        Bytes,
    }

    const MODES: [Mode; 17] = [
        Mode::Any,
        Mode::Bool,
        Mode::I64,
        Mode::I128,
        Mode::U64,
        Mode::U128,
        Mode::F64,
        Mode::Str,
        Mode::Option,
        Mode::Unit,
        Mode::Seq,
        Mode::Map,
        Mode::Tuple2,
        Mode::Newtype,
        Mode::Enum,
        Mode::Ignored,
        Mode::Bytes,
    ];

    impl<'de> DeserializeSeed<'de> for Mode {
        type Value = String;

        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
            match self {
                Mode::Any => d.deserialize_any(Tracer),
                Mode::Bool => d.deserialize_bool(Tracer),
                Mode::I64 => d.deserialize_i64(Tracer),
                Mode::I128 => d.deserialize_i128(Tracer),
                Mode::U64 => d.deserialize_u8(Tracer),
                Mode::U128 => d.deserialize_u128(Tracer),
                Mode::F64 => d.deserialize_f32(Tracer),
                Mode::Str => d.deserialize_identifier(Tracer),
                Mode::Option => d.deserialize_option(Tracer),
                Mode::Unit => d.deserialize_unit_struct("U", Tracer),
                Mode::Seq => d.deserialize_seq(Tracer),
                Mode::Map => d.deserialize_struct("S", &["a"], Tracer),
                Mode::Tuple2 => d.deserialize_tuple(2, Tracer),
                Mode::Newtype => d.deserialize_newtype_struct("N", Tracer),
                Mode::Enum => d.deserialize_enum("E", &["Red", "Green"], Tracer),
                Mode::Ignored => d.deserialize_ignored_any(Tracer),
                Mode::Bytes => d.deserialize_bytes(Tracer),
            }
        }
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    enum Color {
        Red,
        Green,
    }

    /// Typed fields of every kind, as a struct reads them.
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Typed {
        b: Option<bool>,
        i: Option<i32>,
        u: Option<u16>,
        f: Option<f64>,
        s: Option<String>,
        c: Option<char>,
        unit: Option<()>,
        color: Option<Color>,
        list: Option<Vec<Option<String>>>,
        map: Option<BTreeMap<String, String>>,
        pair: Option<(i64, String)>,
        newtype: Option<Newtype>,
        #[serde(default)]
        plain: Vec<u8>,
        #[serde(default)]
        labels: BTreeMap<String, serde_json::Value>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Newtype(u32);

    fn ng_location(e: &serde_yaml_ng::Error) -> (Option<usize>, Option<usize>) {
        e.location().map(|l| (l.line(), l.column())).unzip()
    }

    /// Decoded by both decoders through `seed`: equal values, or equal errors.
    fn same_seed<S>(text: &str, seed: S, what: &str)
    where
        S: for<'de> DeserializeSeed<'de, Value: Debug> + Clone,
    {
        let ours = from_str_seed(text, seed.clone());
        let theirs = seed.deserialize(serde_yaml_ng::Deserializer::from_str(text));
        match (ours, theirs) {
            (Ok(a), Ok(b)) => assert_eq!(format!("{a:?}"), format!("{b:?}"), "{what}: {text:?}"),
            (Err(a), Err(b)) => {
                assert_eq!(a.unsupported(), None, "{what}: {text:?}: {a}");
                assert_eq!(a.to_string(), b.to_string(), "{what}: {text:?}");
                assert_eq!(
                    (a.line(), a.column()),
                    ng_location(&b),
                    "{what}: {text:?}: {a}"
                );
            }
            (a, b) => panic!("{what}: {text:?}: ours {a:?}, serde_yaml_ng {b:?}"),
        }
    }

    fn same<T: DeserializeOwned + Debug>(text: &str) {
        same_seed(
            text,
            std::marker::PhantomData::<T>,
            std::any::type_name::<T>(),
        );
    }

    /// YAML documents: the agent's test manifests, and the corners of YAML a manifest may use.
    fn corpus() -> Vec<String> {
        let mut docs: Vec<String> = [
            // Manifests from the agent's tests.
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox:1.36\n",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers: [{name: c, image: x}]\n  volumes: [{name: v, configMap: {name: m}}]\n",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers: [{name: c, image: x, envFrom: [{secretRef: {name: s}}]}]\n",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers: [{name: c, image: x}]\n  volumes: [{name: v, downwardAPI: {items: [{path: n, fieldRef: {fieldPath: metadata.name}}]}}]\n",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: kube-system}\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 5\n  containers: [{name: c, image: x, imagePullPolicy: Never}]\n",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: lim}\nspec:\n  containers:\n  - name: c\n    image: x:1\n    resources: {limits: {cpu: 500m, memory: 64Mi}}\n",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: both}\nspec:\n  initContainers:\n  - name: i\n    image: x:1\n    resources: {limits: {cpu: 1}, requests: {cpu: 200m}}\n  containers:\n  - name: c\n    image: x:1\n    resources: {requests: {memory: 1Mi}}\n",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a, uid: my-uid, annotations: {x: y}}\nspec: {containers: [{name: c, image: x}]}\n",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers: [{name: c, image: x}]\n  tolerations:\n  - {operator: Exists, effect: NoExecute, tolerationSeconds: 5}\n  - {key: k, operator: Exists}\n",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, image: x}], terminationGracePeriodSeconds: soon}\n",
            "apiVersion: v1\nkind: Pod\nmetadata: [\n",
            "kind: Pod\napiVersion: v1\nmetadata: [oops\n",
            "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n",
            "apiVersion: v1\nkind: List\nitems: []\n",
            "kind: PodList\napiVersion: v1\nitems: {a: 1}\n",
            "kind: PodList\napiVersion: v1\nitems: null\n",
            "items:\n- metadata: {name: y}\n  spec: {containers: [{name: c, image: x}]}\nkind: PodList\napiVersion: v1\n",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{image: x}]}\n",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, image: ' '}]}\n",
            "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n",
            // A fuller pod: block and flow styles, comments, quoting, block scalars, numbers.
            "# a static pod\n---\napiVersion: \"v1\"\nkind: 'Pod'\nmetadata:\n  name: full   # trailing comment\n  labels:\n    app: web\n    tier: \"1\"\n    'quoted key': yes\n  annotations: {a: 'it''s', b: \"tab\\there\", c: ~, d: 'null', e: \"ünïcødé ✓\"}\nspec:\n  hostNetwork: true\n  priority: 0x10\n  activeDeadlineSeconds: +30\n  terminationGracePeriodSeconds: 0o17\n  containers:\n  - name: c\n    image: busybox\n    command:\n    - sh\n    - -c\n    - |\n      echo one\n      echo two\n    args: [>-\n        folded\n        text, '', \"\", plain text]\n    env:\n    - {name: A, value: '0777'}\n    - name: B\n      value: \"123\"\n    - name: C\n    - name: D\n      value:\n    ports:\n    - containerPort: 8080\n      protocol: TCP\n    resources:\n      limits: {cpu: 0.5, memory: 1e3}\n...\n",
            // Scalars at the root (`---` alone is a document of an empty scalar).
            "---\n", "--- ''\n", "~", "null", "Null", "NULL", "nUll", "''", "\"\"", "true", "True", "TRUE", "tRUE",
            "false", "yes", "no", "on", "0", "-0", "+0", "00", "0777", "-0777", "+0777", "0777.5",
            "1", "+1", "-1", "++1", "+-1", "-+1", "12345678901234567890", "18446744073709551616",
            "-9223372036854775809", "340282366920938463463374607431768211456",
            "-170141183460469231731687303715884105729", "0x1F", "0x1f", "-0x1F", "+0x1F", "0x-1",
            "0x+1", "0x", "0o17", "-0o17", "0o8", "0b101", "-0b101", "0b2", "0xFFFFFFFFFFFFFFFFFF",
            "1_000", ".5", "-.5", "+.5", "5.", "1e3", "1E-3", "1e400", "-1e400", ".inf", "+.inf",
            "-.inf", ".Inf", "-.INF", ".nan", ".NaN", ".NAN", "+.nan", "-.nan", "nan", "inf",
            "infinity", "0.0", "-0.0", "3.14", "'3.14'", "\"0x1F\"", "'true'", "'~'", "abc",
            "hello world", "a: b: c", "ünïcødé", "\"\\u00e9\\x41\"", "'multi\n  line'",
            "plain\n  continued\n\n  para", "|\n  literal\n  text\n", ">\n  folded\n  text\n",
            "|-\n  stripped\n", "|+\n  kept\n\n", "- x", "a", "[]", "{}", "[1, two, 3.0, ~, '']",
            "{a: 1, b: [x, y], c: {d: e}}", "- a\n- - b\n  - c\n- {d: e}\n",
            "a:\nb: ~\nc: ''\nd: []\n", "[a, b, c]", "[1]", "[1, 2]", "[1, 2, 3]", "Red", "Blue",
            "''\n", "{Red: 1}", "[Red]",
            // Keys that are not strings, and repeated keys.
            "1: one\n2: two\n", "true: t\n~: n\n0x1F: h\n", "[a, b]: list key\n", "{a: 1}: map key\n",
            "a: 1\na: 2\n", "apiVersion: v1\nkind: Pod\nmetadata: {name: a, name: b}\nspec: {containers: [{name: c, image: x}]}\n",
            // Anchors without aliases are ignored.
            "a: &x 1\nb: &y [1, 2]\nc: &z {d: e}\n",
            // Directives.
            "%YAML 1.1\n---\na: 1\n",
            // Syntax errors, early and late, and after a decoding error.
            "]", "a: [1, 2\n", "a: 'open", "a: \"bad \\q escape\"", "\tkey: v", "a: 1\n b: 2\n",
            "a: 1\n- b\n", "{a: 1", "key: value\nother\n", "a: b\n  c: d\n", "x: @at",
            "a: 1\nb: [\n", "i: x\nb: [\n",
            // Byte-order mark and carriage returns.
            "\u{feff}a: 1\n", "a: 1\r\nb: 2\r\n",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        // Typed fields: good values and bad ones.
        for field in [
            "b: true",
            "b: yes",
            "b: 'true'",
            "b: 1",
            "i: 0x1F",
            "i: -0x1F",
            "i: 0777",
            "i: +5",
            "i: '5'",
            "i: 99999999999",
            "i: 1.5",
            "i: ~",
            "i:",
            "u: -1",
            "u: 70000",
            "u: 0b11",
            "f: .5",
            "f: 1",
            "f: .nan",
            "f: -.inf",
            "f: '1.5'",
            "f: 1e400",
            "s: 123",
            "s: 'x'",
            "s: |\n    block",
            "s: [a]",
            "s: {a: b}",
            "s:",
            "s: ~",
            "s: ''",
            "c: x",
            "c: xy",
            "c: 1",
            "unit: ~",
            "unit: ''",
            "unit: x",
            "unit:",
            "color: Red",
            "color: Blue",
            "color: ''",
            "color: 'Green'",
            "color: {Red: 1}",
            "color: [Red]",
            "color:",
            "list:",
            "list: ''",
            "list: [a, ~, '', 1]",
            "list: x",
            "list: {a: b}",
            "map:",
            "map: ''",
            "map: {a: 1, b: ~}",
            "map: [a]",
            "map: {a: [1]}",
            "pair: [1, x]",
            "pair: [1]",
            "pair: [1, x, y]",
            "pair: [1, x, {a: b}]",
            "newtype: 7",
            "newtype: x",
            "plain: ''",
            "plain: [1, 2]",
            "plain: ~",
            "labels: {a: 1, b: '1', c: ~, d: [1], e: 1.5}",
            "unknown: [deep, {nested: [1, 2, {x: y}]}]",
            "b: true\nb: false",
        ] {
            docs.push(format!("{field}\n"));
            docs.push(format!("s: before\n{field}\ni: 3\n"));
        }
        docs
    }

    #[test]
    fn decodes_as_serde_yaml_ng_does() {
        for text in corpus() {
            same::<Pod>(&text);
            same::<serde_json::Value>(&text);
            same::<Trace>(&text);
            same::<Typed>(&text);
            same::<BTreeMap<String, String>>(&text);
            same::<Vec<serde_json::Value>>(&text);
            for mode in MODES {
                same_seed(&text, mode, &format!("{mode:?}"));
            }
        }
    }

    fn trace(text: &str) -> String {
        from_str::<Trace>(text).expect("decodes").0
    }

    #[test]
    fn plain_scalars_resolve_as_in_serde_yaml_ng() {
        for (text, want) in [
            ("---\n", "unit"),
            ("~", "unit"),
            ("null", "unit"),
            ("NULL", "unit"),
            ("nUll", "bstr:nUll"),
            ("True", "bool:true"),
            ("FALSE", "bool:false"),
            ("yes", "bstr:yes"),
            ("0x1F", "u64:31"),
            ("-0x1F", "i64:-31"),
            ("0o17", "u64:15"),
            ("0b101", "u64:5"),
            ("+1", "u64:1"),
            ("-1", "i64:-1"),
            ("0777", "bstr:0777"),
            ("18446744073709551616", "u128:18446744073709551616"),
            ("-9223372036854775809", "i128:-9223372036854775809"),
            (".5", "f64:0.5:3fe0000000000000"),
            ("-.inf", "f64:-inf:fff0000000000000"),
            (".NaN", "f64:NaN:7ff8000000000000"),
            ("1e400", "bstr:1e400"),
            ("nan", "bstr:nan"),
            ("'123'", "bstr:123"),
            ("\"true\"", "bstr:true"),
            ("''", "bstr:"),
            ("'it''s'", "str:it's"),
            ("|\n  x\n", "str:x\n"),
            ("[1, a]", "[u64:1,bstr:a]"),
            ("{1: a, ~: b}", "{u64:1=bstr:a,unit=bstr:b}"),
        ] {
            assert_eq!(trace(text), want, "{text:?}");
        }
    }

    #[test]
    fn strings_take_any_scalar_and_numbers_only_plain_ones() {
        assert_eq!(from_str::<String>("123").expect("str"), "123");
        assert_eq!(from_str::<String>("~").expect("str"), "~");
        assert_eq!(from_str::<String>("---\n").expect("str"), "");
        assert_eq!(from_str::<i64>("0x1F").expect("int"), 31);
        assert_eq!(from_str::<u8>("+7").expect("int"), 7);
        assert_eq!(from_str::<f64>("1").expect("float"), 1.0);
        assert!(from_str::<i64>("'5'").is_err());
        assert!(from_str::<i64>("0777").is_err());
        assert!(from_str::<bool>("\"true\"").is_err());
        assert!(from_str::<String>("[a]").is_err());
    }

    #[test]
    fn options_units_and_empty_collections() {
        #[derive(Debug, Deserialize, PartialEq)]
        struct O {
            a: Option<String>,
            #[serde(default)]
            v: Vec<i32>,
            #[serde(default)]
            m: BTreeMap<String, i32>,
        }
        let o = |text: &str| from_str::<O>(text).expect("decodes");
        assert_eq!(o("a:\nv:\nm:\n").a, None);
        assert_eq!(o("a: ~\n").a, None);
        assert_eq!(o("a: null\n").a, None);
        assert_eq!(o("a: ''\n").a, Some(String::new()));
        assert_eq!(o("a: 'null'\n").a, Some("null".into()));
        assert_eq!(o("a: 0\n").a, Some("0".into()));
        assert_eq!(o("v:\nm:\n").v, Vec::<i32>::new());
        assert_eq!(o("v:\nm:\n").m, BTreeMap::new());
        // An empty collection is written as an empty plain scalar, not a quoted one or a null.
        assert!(from_str::<O>("v: ''\n").is_err());
        assert!(from_str::<O>("m: ~\n").is_err());
        assert!(from_str::<O>("a: x\nv: [1, y]\n").is_err());
        assert_eq!(
            from_str::<Vec<i32>>("---\n").expect("empty"),
            Vec::<i32>::new()
        );
        from_str::<()>("~").expect("unit");
        from_str::<()>("---\n").expect("unit");
        assert!(from_str::<()>("''").is_err());
    }

    #[test]
    fn errors_carry_the_path_line_and_column() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct S {
            a: i32,
            b: Vec<Inner>,
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Inner {
            x: bool,
        }
        let e = from_str::<S>("a: 1\nb:\n- x: true\n- x: maybe\n").expect_err("bad bool");
        assert_eq!(
            e.to_string(),
            "b[1].x: invalid type: string \"maybe\", expected a boolean at line 4 column 6"
        );
        assert_eq!((e.line(), e.column()), (Some(4), Some(6)));
        assert!(e.message().starts_with("b[1].x: "));
        // A missing field is reported at the start of its mapping.
        let e = from_str::<S>("a: 1\nb:\n- {}\n").expect_err("missing x");
        assert_eq!(e.to_string(), "b[0]: missing field `x` at line 3 column 3");
        // A syntax error: libyaml's words and place.
        let e = from_str::<S>("a: 1\nb: [\n").expect_err("syntax");
        assert_eq!((e.line(), e.column()), (Some(3), Some(1)));
        assert!(e.to_string().contains("while parsing a flow"), "{e}");
        assert_eq!(e.unsupported(), None);
    }

    #[test]
    fn the_recursion_limit_is_serde_yaml_ngs() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        from_str::<serde_json::Value>(&nested(depth::MAX_DEPTH)).expect("at the limit");
        let e = from_str::<serde_json::Value>(&nested(depth::MAX_DEPTH + 1)).expect_err("past it");
        assert_eq!(
            e.to_string(),
            "recursion limit exceeded at line 1 column 129"
        );
        assert_eq!(
            (e.line(), e.column()),
            (Some(1), Some(depth::MAX_DEPTH + 1))
        );
        // Skipped content has no limit of its own (the depth walk bounds it before decoding).
        from_str::<de::IgnoredAny>(&nested(1000)).expect("skipped");
        for n in [depth::MAX_DEPTH, depth::MAX_DEPTH + 1] {
            same::<serde_json::Value>(&nested(n));
            same::<Trace>(&format!("{}x\n", "- ".repeat(n)));
        }
    }

    #[test]
    fn aliases_tags_and_other_than_one_document_are_unsupported() {
        for (text, what, line, column) in [
            ("a: &x 1\nb: *x\n", Unsupported::Alias, 2, 4),
            ("a: !!str 1\n", Unsupported::Tag, 1, 4),
            ("a: !custom 1\n", Unsupported::Tag, 1, 4),
            ("!!map {a: 1}\n", Unsupported::Tag, 1, 1),
            ("a: !!seq []\n", Unsupported::Tag, 1, 4),
            ("a: 1\n---\nb: 2\n", Unsupported::MoreThanOneDocument, 2, 1),
            ("a: 1\n...\n---\n", Unsupported::MoreThanOneDocument, 3, 1),
            ("a: 1\n---\n[\n", Unsupported::MoreThanOneDocument, 2, 1),
            ("", Unsupported::NoDocument, 1, 1),
            ("# only a comment\n", Unsupported::NoDocument, 2, 1),
        ] {
            let e = from_str::<serde_json::Value>(text).expect_err(text);
            assert_eq!(e.unsupported(), Some(what), "{text:?}: {e}");
            assert_eq!(
                (e.line(), e.column()),
                (Some(line), Some(column)),
                "{text:?}"
            );
        }
        // Even where the visitor skips the node, or drops the error.
        let e = from_str::<de::IgnoredAny>("a: [*x]\n").expect_err("alias");
        assert_eq!(e.unsupported(), Some(Unsupported::Alias));
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Lenient {
            #[serde(default, deserialize_with = "ignore_errors")]
            a: Option<String>,
        }
        fn ignore_errors<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
            Ok(Option::<String>::deserialize(d).ok().flatten())
        }
        let e = from_str::<Lenient>("a: !!str x\n").expect_err("tag");
        assert_eq!(e.unsupported(), Some(Unsupported::Tag));
        // A decoding error before the unsupported node is the error, as serde_yaml_ng says.
        let e = from_str::<BTreeMap<String, i32>>("a: x\nb: *y\n").expect_err("bad int");
        assert_eq!(e.unsupported(), None);
        assert_eq!(e.line(), Some(1));
        // The empty string is an empty stream, but a document of an empty scalar is not.
        assert_eq!(trace("--- # empty\n"), "unit");
    }

    /// A pod with `vars` env vars, as YAML.
    fn pod_with_env(vars: usize) -> String {
        let mut text = String::from(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: big\nspec:\n  containers:\n  - name: c\n    image: busybox\n    env:\n",
        );
        for i in 0..vars {
            text.push_str(&format!(
                "    - name: VARIABLE_NUMBER_{i:06}\n      value: \"a value of some length, number {i}\"\n"
            ));
        }
        text
    }

    #[test]
    fn a_large_manifest_is_decoded_one_event_at_a_time() {
        let text = pod_with_env(40_000);
        assert!(text.len() > 3_000_000, "{}", text.len());
        live::reset();
        let pod: Pod = from_str(&text).expect("decodes");
        let (most, total) = live::counts();
        let env = pod.spec.as_ref().and_then(|s| s.containers[0].env.as_ref());
        assert_eq!(env.map(Vec::len), Some(40_000));
        // Each env var is a mapping of two keys and two values: 6 events, and all of them were
        // parsed, but never more than one was held.
        assert!(total > 6 * 40_000, "{total} events");
        assert_eq!(most, 1, "events alive at once");
        // The same holds for a small manifest: the most held does not grow with the document.
        live::reset();
        let _: Pod = from_str(&pod_with_env(3)).expect("decodes");
        assert_eq!(live::counts().0, most);
        // And the result is serde_yaml_ng's.
        let theirs: Pod = serde_yaml_ng::from_str(&text).expect("decodes");
        assert_eq!(pod, theirs);
    }
}
