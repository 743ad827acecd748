// ftfy 6.1's fix_text(s, normalization="NFKC"), which the H2O repository's request
// adaptor applies to every context and continuation. Implemented from ftfy's documented
// behaviour, fix by fix in its order: HTML entities (unless the segment has a "<"),
// terminal escapes, mojibake repair (latin-1 / sloppy windows-1252 text re-decoded as
// UTF-8 when ftfy's badness rules flag it), C1 controls, Latin ligatures, character
// width, curly quotes, line breaks, surrogates, control characters and NFKC (ICU),
// repeated until nothing changes, one line at a time.
//
// Not covered: mojibake through the other single-byte encodings ftfy tries (windows-1250,
// -1251, -1253, -1254, iso-8859-2, MacRoman, cp437) and HTML entity names outside the
// common table in ftfy.cpp; text that needs them is left as it is.
#pragma once
#include <string>

namespace kvevict {

// UTF-8 in, UTF-8 out; throws kvevict::Error on invalid UTF-8 input.
std::string ftfy_fix_text_nfkc(const std::string& utf8);

}  // namespace kvevict
