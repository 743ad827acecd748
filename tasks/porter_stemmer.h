// Porter stemmer with the exact behaviour of NLTK's PorterStemmer in its default
// NLTK_EXTENSIONS mode (NLTK 3.x), which is what rouge_score uses. The original
// 1980 algorithm and Snowball's "porter" differ from it on a few percent of words.
#pragma once
#include <string>

namespace kvevict {

// Stems one word as `PorterStemmer().stem(word)` does: the irregular-form table
// is looked up with the word as given, the word is lowercased (ASCII only), words of
// at most 2 characters are returned lowercased, everything else goes through steps
// 1a..5b. Non-letters (digits) count as consonants, as in NLTK.
std::string porter_stem(const std::string& word);

}  // namespace kvevict
