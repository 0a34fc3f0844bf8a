//! What the elements check in a text before it is spoken, beyond what the engine refuses:
//!
//! - markup they do not interpret ([`strip_markup_tags`]): SSML (`<speak>`, `<break
//!   time='1s'/>`, `<prosody>`, …) and other XML-like tags would be read out as text; omnitts
//!   speaks plain text only, so the tags are removed (the text inside them is spoken, entities
//!   decoded) and the element warns;
//! - characters of a script that none of the checkpoint's languages is written in
//!   ([`uncovered_scripts`]): Chinese to the English bundled voice runs silently or as noise, so
//!   the element warns, once per text.
//!
//! Both are warnings (GStreamer warning messages on the bus), not errors: the text is still spoken.

use unicode_script::{Script, UnicodeScript};

use super::input_error::quoted;

/// `text` with its XML-like tags removed, and the names of the tags found (in order of first
/// appearance, each once); `None` when it has none (the text is used as it is).
///
/// A tag is `<name …>`, `</name>` or `<name …/>` with `name` an ASCII letter followed by letters,
/// digits, `-`, `_`, `:` or `.`, and no `<` before its `>`; XML declarations (`<?…?>`), comments
/// and doctypes (`<!…>`) are removed too. A tag between two words becomes a space. The text is
/// taken as markup only when it has a closing tag (`</…>`), an empty tag (`<…/>`), a declaration
/// or a comment, so that `if a<b or b> c` stays text; then the XML entities (`&amp;`, `&lt;`,
/// `&#233;`, …) are decoded too. Anything else (`a < b`, `<3`) stays as it is.
pub(crate) fn strip_markup_tags(text: &str) -> Option<(String, Vec<String>)> {
    let mut out = String::with_capacity(text.len());
    let mut names: Vec<String> = Vec::new();
    let mut markup = false;
    let mut rest = text;
    while let Some(at) = rest.find('<') {
        out.push_str(&rest[..at]);
        let from = &rest[at..];
        match tag_len(from) {
            Some((len, name)) => {
                let tag = &from[..len];
                markup |= name.is_none() || tag.starts_with("</") || tag.ends_with("/>");
                if let Some(name) = name
                    && !names.iter().any(|n| n == name)
                {
                    names.push(name.to_string());
                }
                let after = &from[len..];
                let glued = out.chars().next_back().is_some_and(|c| !c.is_whitespace())
                    && after.chars().next().is_some_and(|c| !c.is_whitespace());
                if glued {
                    out.push(' ');
                }
                rest = after;
            }
            None => {
                out.push('<');
                rest = &from[1..];
            }
        }
    }
    out.push_str(rest);
    if !markup {
        return None;
    }
    Some((decode_entities(&out), names))
}

/// The length of the tag at the start of `s` (which starts with `<`) and its name (`None` for
/// `<?…?>` and `<!…>`), or `None` when `s` does not start with a tag.
fn tag_len(s: &str) -> Option<(usize, Option<&str>)> {
    let end = s.find('>')?;
    let inner = &s[1..end];
    if inner.contains('<') {
        return None;
    }
    if let Some(comment) = s.strip_prefix("<!--") {
        let close = comment.find("-->")?;
        return Some((4 + close + 3, None));
    }
    if inner.starts_with('?') || inner.starts_with('!') {
        return Some((end + 1, None));
    }
    let body = inner.strip_prefix('/').unwrap_or(inner);
    let name_len = body
        .char_indices()
        .find(|&(i, c)| {
            !(c.is_ascii_alphabetic()
                || (i > 0 && (c.is_ascii_digit() || matches!(c, '-' | '_' | ':' | '.'))))
        })
        .map_or(body.len(), |(i, _)| i);
    if name_len == 0 {
        return None;
    }
    // After the name: nothing, attributes after a space, or the `/` of an empty tag.
    let after = &body[name_len..];
    if !(after.is_empty() || after.starts_with(char::is_whitespace) || after == "/") {
        return None;
    }
    Some((end + 1, Some(&body[..name_len])))
}

/// XML entities and character references decoded; an `&` that starts none stays.
fn decode_entities(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let from = &rest[at..];
        let (c, len) = leading_entity(from);
        out.push(c);
        rest = &from[len..];
    }
    out.push_str(rest);
    out
}

/// The entity or character reference at the start of `s` (which starts with `&`): its character
/// and its length in bytes; `('&', 1)` when none starts there.
pub(crate) fn leading_entity(s: &str) -> (char, usize) {
    s.find(';')
        .filter(|&end| end <= 10)
        .and_then(|end| entity(&s[1..end]).map(|c| (c, end + 1)))
        .unwrap_or(('&', 1))
}

/// The character an entity name (between `&` and `;`) stands for (named XML/HTML entities and
/// numeric references).
fn entity(name: &str) -> Option<char> {
    match name {
        "amp" => Some('&'),
        "lt" => Some('<'),
        "gt" => Some('>'),
        "quot" => Some('"'),
        "apos" => Some('\''),
        "nbsp" => Some('\u{a0}'),
        _ => {
            let code = if let Some(hex) = name.strip_prefix("#x").or(name.strip_prefix("#X")) {
                u32::from_str_radix(hex, 16).ok()?
            } else {
                name.strip_prefix('#')?.parse().ok()?
            };
            char::from_u32(code)
        }
    }
}

/// The warning for markup removed from `text` (its tag names `names`; `plain`: the text left,
/// which may be nothing to speak).
pub(crate) fn markup_warning(text: &str, names: &[String], plain: &str) -> String {
    let tags = if names.is_empty() {
        // Comments, declarations or processing instructions only: no element names.
        "comments or declarations".to_string()
    } else {
        names
            .iter()
            .take(6)
            .map(|n| format!("<{n}>"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let left = if plain.trim().is_empty() {
        "nothing is left to speak"
    } else {
        "the text between them is spoken"
    };
    format!(
        "text '{}': markup ({tags}) is not interpreted, as omnitts speaks plain text (SSML is \
         not supported): the tags were removed and {left}",
        quoted(text)
    )
}

/// The scripts a language of a checkpoint is written in; `None` for a language this table does
/// not know (then no script is warned about).
fn language_scripts(language: &str) -> Option<&'static [Script]> {
    use Script::*;
    Some(match language.to_ascii_lowercase().as_str() {
        "auto" => &[],
        "english" | "german" | "french" | "spanish" | "italian" | "portuguese" | "dutch"
        | "polish" | "turkish" | "vietnamese" | "indonesian" => &[Latin],
        "russian" | "ukrainian" => &[Cyrillic],
        "chinese" | "cantonese" => &[Han, Bopomofo],
        l if l.ends_with("_dialect") => &[Han, Bopomofo],
        "japanese" => &[Han, Hiragana, Katakana],
        "korean" => &[Hangul, Han],
        "arabic" => &[Arabic],
        "greek" => &[Greek],
        "hebrew" => &[Hebrew],
        "thai" => &[Thai],
        "hindi" => &[Devanagari],
        _ => return None,
    })
}

/// The scripts of `text`'s letters that none of `languages` (a checkpoint's language names) is
/// written in, each with the first character of it, in order of appearance; empty when every
/// letter is covered, or when a language is not in this module's table. Digits, punctuation,
/// symbols and combining marks (scripts Common and Inherited) are never reported.
pub(crate) fn uncovered_scripts(text: &str, languages: &[String]) -> Vec<(Script, char)> {
    let mut covered: Vec<Script> = Vec::new();
    for l in languages {
        match language_scripts(l) {
            Some(scripts) => covered.extend_from_slice(scripts),
            None => return Vec::new(),
        }
    }
    if covered.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<(Script, char)> = Vec::new();
    for c in text.chars().filter(|c| c.is_alphabetic()) {
        let script = c.script();
        if matches!(script, Script::Common | Script::Inherited | Script::Unknown)
            || covered.contains(&script)
            || out.iter().any(|(s, _)| *s == script)
        {
            continue;
        }
        out.push((script, c));
    }
    out
}

/// Every warning `text` gets before it is spoken by a checkpoint described by `d`: letters of a
/// script none of its languages is written in ([`language_warning`]), words before the first
/// speaker-turn tag ([`untagged_lead_warning`]), `<|…|>` markup a model without speaker turns
/// reads as text ([`unread_markup_warning`]).
pub(crate) fn text_warnings(
    text: &str,
    d: &crate::models::tts::ModelDescription,
) -> impl Iterator<Item = String> {
    [
        language_warning(text, &d.languages),
        emoji_warning(text),
        untagged_lead_warning(text, d.speaker_turn_tag),
        unread_markup_warning(text, d),
    ]
    .into_iter()
    .flatten()
}

/// Whether `c` is an emoji or pictograph: the Unicode blocks of pictographs, emoticons, transport
/// and map symbols, the supplemental symbols and pictographs, regional indicators (flags), the
/// miscellaneous symbols, dingbats and symbols and arrows (☀, ✈, ⭐).
fn is_pictograph(c: char) -> bool {
    matches!(c as u32, 0x1F000..=0x1FAFF | 0x2600..=0x27BF | 0x2B00..=0x2BFF)
}

/// The warning for `text` when it has words and emoji or pictographs among them: the model has
/// no reading for them and speaks each as noise (a second or more of babble for a few; a text of
/// nothing else is refused, [`crate::models::tts::text::no_words_to_speak`]). `None` otherwise.
pub(crate) fn emoji_warning(text: &str) -> Option<String> {
    let mut pictographs = text.chars().filter(|&c| is_pictograph(c));
    let first = pictographs.next()?;
    if crate::models::tts::text::unspeakable(text).is_some() {
        return None;
    }
    let n = 1 + pictographs.count();
    let (them, they_mean) = if n == 1 {
        ("it", "it means")
    } else {
        ("them", "they mean")
    };
    Some(format!(
        "text '{}': it has {} ('{first}'), which the model speaks as noise, not as words; remove \
         {them} or write what {they_mean}",
        quoted(text),
        super::messages::count_of(n, "emoji or pictograph"),
    ))
}

/// The warning for `text` when it holds markup of the special-token form `<|…|>` (such as a
/// speaker-turn tag `<|speaker:0|>`) and the model described by `d` has no speaker turns: it
/// reads the markup as text. `None` otherwise.
pub(crate) fn unread_markup_warning(
    text: &str,
    d: &crate::models::tts::ModelDescription,
) -> Option<String> {
    if d.speaker_turn_tag.is_some() {
        return None;
    }
    let markup = crate::models::tts::text::first_markup(text)?;
    Some(format!(
        "text '{}': '{}' is read as text: {} has no speaker turns or other <|…|> markup; \
         remove it, or give each speaker's text as an utterance of its own with its voice",
        quoted(text),
        quoted(markup),
        d.name
    ))
}

/// The warning for `text` when it has words before its first speaker-turn tag (the model's
/// `turn_tag`, e.g. `<|speaker:`), which the model does not speak: it speaks turns only, as the
/// reference does. `None` for a model without turns or a text without such words.
pub(crate) fn untagged_lead_warning(text: &str, turn_tag: Option<&str>) -> Option<String> {
    let lead = super::turns::untagged_lead(text, turn_tag?)?;
    Some(format!(
        "text '{}': the words before its first speaker tag ('{}') are not spoken: the model \
         speaks its turns only; start the text with a tag such as {}0|>",
        quoted(text),
        quoted(lead),
        turn_tag.unwrap_or_default()
    ))
}

/// The warning for `text`, whose letters include the `uncovered` scripts, spoken by a checkpoint
/// of `languages`; `None` when there are none.
pub(crate) fn script_warning(
    text: &str,
    languages: &[String],
    uncovered: &[(Script, char)],
) -> Option<String> {
    if uncovered.is_empty() {
        return None;
    }
    let scripts = uncovered
        .iter()
        .map(|(s, c)| format!("{} ('{c}')", s.full_name()))
        .collect::<Vec<_>>()
        .join(", ");
    let langs = languages
        .iter()
        .filter(|l| *l != "auto")
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    let noun = if uncovered.len() == 1 {
        "script"
    } else {
        "scripts"
    };
    Some(format!(
        "text '{}': it has letters of the {scripts} {noun}, which none of the checkpoint's \
         languages ({langs}) is written in; the model will likely speak them as silence or \
         noise (use a checkpoint for that language)",
        quoted(text)
    ))
}

/// The warnings for `text` spoken by a checkpoint of `languages` (see [`uncovered_scripts`]).
pub(crate) fn language_warning(text: &str, languages: &[String]) -> Option<String> {
    script_warning(text, languages, &uncovered_scripts(text, languages))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn langs(l: &[&str]) -> Vec<String> {
        l.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ssml_tags_are_removed_and_named() {
        let ssml = "<?xml version=\"1.0\"?><speak version='1.1'>Hello<break time='1s'/>world. \
                    <prosody rate=\"slow\">Tom &amp; Jerry</prosody><!-- note --></speak>";
        let (text, names) = strip_markup_tags(ssml).unwrap();
        assert_eq!(text.trim(), "Hello world. Tom & Jerry");
        assert_eq!(names, ["speak", "break", "prosody"]);
        let w = markup_warning(ssml, &names, &text);
        assert!(
            w.contains("<speak>, <break>, <prosody>")
                && w.contains("SSML is not supported")
                && w.contains("the text between them is spoken"),
            "{w}"
        );
        // Markup alone: nothing is said to be spoken.
        let (empty, names) = strip_markup_tags("<speak></speak>").unwrap();
        let w = markup_warning("<speak></speak>", &names, &empty);
        assert!(w.contains("nothing is left to speak"), "{w}");
        // A comment alone names no element.
        let (text, names) = strip_markup_tags("<!-- c --> Hello").unwrap();
        assert_eq!((text.trim(), names.len()), ("Hello", 0));
        let w = markup_warning("<!-- c --> Hello", &names, &text);
        assert!(w.contains("markup (comments or declarations)"), "{w}");
        // Namespaced and HTML-like tags too.
        assert_eq!(
            strip_markup_tags("<mstts:express-as style='x'>Hi</mstts:express-as> <b>there</b>")
                .unwrap()
                .0,
            "Hi there"
        );
    }

    #[test]
    fn emoji_among_words_are_warned_about() {
        let w = emoji_warning("I love it 😀🎉 so much! ✈").expect("a warning");
        assert!(w.contains("3 emoji or pictographs ('😀')"), "{w}");
        assert!(w.contains("noise"), "{w}");
        let one = emoji_warning("Sunny ☀ today.").expect("a warning");
        assert!(one.contains("1 emoji or pictograph ('☀')") && one.contains("remove it"));
        // No emoji, or nothing else (refused as having no words, not warned about).
        for t in [
            "I love it so much!",
            "Price: $3.50 → 4 €, 50% © ™",
            "😀🎉",
            "",
        ] {
            assert_eq!(emoji_warning(t), None, "{t:?}");
        }
    }

    #[test]
    fn turn_markup_is_named_for_a_model_without_turns() {
        use crate::models::qwen3_tts::{ModelVariant, served_description};
        let mut d = served_description(ModelVariant::CustomVoice, vec![], vec![], false);
        let text = "<|speaker:0|>Hi. <|speaker:1|>Fine.";
        let w = unread_markup_warning(text, &d).expect("a warning");
        assert!(w.contains("'<|speaker:0|>' is read as text"), "{w}");
        assert!(w.contains(&d.name), "{w}");
        assert_eq!(text_warnings(text, &d).count(), 1);
        for plain in ["a <| b", "x |> y <| z", "Hello."] {
            assert_eq!(unread_markup_warning(plain, &d), None, "{plain:?}");
        }
        // A model with speaker turns reads its tags.
        d.speaker_turn_tag = Some("<|speaker:");
        assert_eq!(unread_markup_warning(text, &d), None);
    }

    #[test]
    fn text_without_tags_is_left_alone() {
        for plain in [
            "a < b and c > d",
            "I <3 it",
            "x<5>y",
            "Tom &amp; Jerry",
            "",
            "<",
            "if a<b or b> c",
        ] {
            assert_eq!(strip_markup_tags(plain), None, "{plain:?}");
        }
    }

    #[test]
    fn scripts_the_languages_do_not_cover_are_named() {
        let en = langs(&["auto", "english"]);
        let found = uncovered_scripts("Hello 你好, 12 µ é! Привет", &en);
        let names: Vec<_> = found.iter().map(|(s, c)| (s.full_name(), *c)).collect();
        assert_eq!(names, [("Han", '你'), ("Cyrillic", 'П')]);
        let w = language_warning("你好", &en).unwrap();
        assert!(w.contains("Han ('你')") && w.contains("(english)"), "{w}");
        // Covered, or nothing but digits, punctuation and emoji.
        assert_eq!(language_warning("Hello, café! 3.5 😀 — ok", &en), None);
        let all = langs(&[
            "chinese",
            "english",
            "japanese",
            "korean",
            "russian",
            "sichuan_dialect",
        ]);
        assert_eq!(
            language_warning("你好 こんにちは カタカナ 안녕 Привет", &all),
            None
        );
        assert!(language_warning("مرحبا", &all).unwrap().contains("Arabic"));
        // A language the table does not know: no guess.
        assert_eq!(
            language_warning("你好", &langs(&["english", "klingon"])),
            None
        );
    }
}
