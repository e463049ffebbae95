// Scanning MSL text, shared by the translator (msl_translate.h) and the strict check's
// source preparation (msl_strict_source.h). Offsets index the text as given.
#pragma once
#include <string>
#include <vector>

namespace mq::cpu {

bool is_ident_char(char c);
bool is_ident_start(char c);
// The source with comments and string/char literals blanked (newlines kept), so
// pattern scans never look inside them. Same length as the input.
std::string mask_comments_and_strings(const std::string& s);
size_t skip_space(const std::string& m, size_t i);
size_t ident_end(const std::string& m, size_t i);
// Positions of whole-word occurrences of `word` in the masked text.
std::vector<size_t> find_word(const std::string& m, const std::string& word);

}  // namespace mq::cpu
