#include "msl_text.h"

#include <algorithm>
#include <cctype>

namespace mq::cpu {

bool is_ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }

std::string mask_comments_and_strings(const std::string& s) {
  std::string m = s;
  size_t i = 0;
  auto blank = [&](size_t a, size_t b) {
    for (size_t k = a; k < b && k < m.size(); ++k)
      if (m[k] != '\n') m[k] = ' ';
  };
  while (i < s.size()) {
    if (s.compare(i, 2, "//") == 0) {
      size_t e = s.find('\n', i);
      if (e == std::string::npos) e = s.size();
      blank(i, e);
      i = e;
    } else if (s.compare(i, 2, "/*") == 0) {
      size_t e = s.find("*/", i + 2);
      e = e == std::string::npos ? s.size() : e + 2;
      blank(i, e);
      i = e;
    } else if (s[i] == '"' || s[i] == '\'') {
      char q = s[i];
      size_t e = i + 1;
      while (e < s.size() && s[e] != q && s[e] != '\n') e += s[e] == '\\' ? 2 : 1;
      blank(i + 1, std::min(e, s.size()));
      i = e + 1;
    } else {
      ++i;
    }
  }
  return m;
}

size_t skip_space(const std::string& m, size_t i) {
  while (i < m.size() && std::isspace(static_cast<unsigned char>(m[i]))) ++i;
  return i;
}

size_t ident_end(const std::string& m, size_t i) {
  while (i < m.size() && is_ident_char(m[i])) ++i;
  return i;
}

std::vector<size_t> find_word(const std::string& m, const std::string& word) {
  std::vector<size_t> hits;
  for (size_t i = m.find(word); i != std::string::npos; i = m.find(word, i + 1)) {
    bool left = i == 0 || !is_ident_char(m[i - 1]);
    bool right = i + word.size() >= m.size() || !is_ident_char(m[i + word.size()]);
    if (left && right) hits.push_back(i);
  }
  return hits;
}

}  // namespace mq::cpu
