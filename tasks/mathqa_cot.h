// MathQA as a chain-of-thought generation task (`mathqa_cot`, tasks/mathqa_cot.cpp): the
// model writes a rationale after few-shot examples that show one, and the answer letter
// is read off its text. The pieces a test checks without a model are declared here.
#pragma once
#include <optional>
#include <string>

namespace kvevict {

// One MathQA item's text as the prompt shows it (already cleaned).
struct MathQaCotItem {
  std::string problem, options, rationale;
  char correct = 'a';  // 'a'..'e'
};

// The query: "Question: <problem>\nOptions: <options>\nRationale:".
std::string mathqa_cot_query(const MathQaCotItem& item);
// A worked example's continuation: " <rationale>\nAnswer: <correct>".
std::string mathqa_cot_target(const MathQaCotItem& item);

// The answer letter of a generation: the letter of the LAST match, in the generation
// lowercased (ASCII), of
//   \banswer\b  then any run of  "is" | ":" | "=" | "option" | "("  (spaces and tabs
//   between), then one letter a-e standing alone (\b on both sides)
// so "Answer: c", "the answer is ( b )", "answer : option e ." and MathQA's own "answer a"
// all give their letter; "answer is 12", "answer: apple" and no "answer" give none
// (scored wrong). "the answer is a number" reads as "a": the article cannot be told
// from the letter.
std::optional<char> mathqa_cot_answer_letter(const std::string& generation);

// MathQA's text holds UTF-8 that was read as windows-1252, then lowercased and spaced out
// token by token: "×" appears as "ã —" (bytes C3 97 -> "Ã—" -> "ã—" -> "ã —"), "–" as
// "â € “", "π" as "ï €". ftfy cannot see these (the characters are apart and
// lowercased), so this repairs them first: in every run of non-ASCII characters separated
// by single spaces, a character whose windows-1252 byte (as it is, or of its uppercase:
// the lowercasing is undone where that is what makes the bytes decode) is the lead byte
// C2, C3, CE, CF or E2 (Latin-1 signs, ×/÷, Greek, punctuation, arrows, mathematical
// operators) is joined with the next characters of the run into the one character those
// bytes encode in UTF-8, when they are continuation bytes (80-BF) and decode. ftfy's
// sloppy windows-1252 is used: bytes 81, 8D, 8F, 90, 9D stand for the C1 controls of the
// same number. Everything else is left as it is (legitimate "× π ×" stays).
std::string repair_spaced_mojibake(const std::string& text);

}  // namespace kvevict
