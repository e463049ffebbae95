#include "msl_translate.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>

#include "../device.h"
#include "msl_text.h"

namespace mq::cpu {
namespace {

[[noreturn]] void refuse(const std::string& where, const std::string& what) {
  std::string message = "[cpu] " + where + ": " + what;
  throw gpu::CompileError(message, message);
}

struct Edit {
  size_t pos, len;
  std::string text;
};

std::string apply_edits(const std::string& s, std::vector<Edit> edits) {
  std::sort(edits.begin(), edits.end(), [](const Edit& a, const Edit& b) { return a.pos < b.pos; });
  std::string out;
  size_t at = 0;
  for (const Edit& e : edits) {
    out.append(s, at, e.pos - at);
    out += e.text;
    at = e.pos + e.len;
  }
  out.append(s, at, std::string::npos);
  return out;
}

std::string blanked(const std::string& s) {
  std::string b = s;
  for (char& c : b)
    if (c != '\n') c = ' ';
  return b;
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

// Index just past the bracket matching the one at `open`.
size_t match_bracket(const std::string& m, size_t open, const std::string& where) {
  int depth = 0;
  for (size_t i = open; i < m.size(); ++i) {
    char c = m[i];
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') {
      if (--depth == 0) return i + 1;
    }
  }
  refuse(where, "unbalanced brackets");
}

// Maps text offsets to MSL (file, line), following `#line N "file"` directives and the
// preprocessor's `# N "file" flags` line markers.
class LineMap {
 public:
  LineMap(const std::string& text, const std::string& name) {
    std::string file = name;
    unsigned line = 1;
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      lines_.push_back({start, file, line});
      const std::string row = text.substr(start, end - start);
      std::istringstream directive(row);
      std::string hash, word;
      directive >> hash;
      if (hash == "#") directive >> word;
      else if (hash.size() > 1 && hash[0] == '#') word = hash.substr(1);
      const bool marker = !word.empty() && word.size() < 10 &&
                          std::all_of(word.begin(), word.end(), [](unsigned char c) { return std::isdigit(c); });
      unsigned next = 0;
      if (marker || (word == "line" && directive >> next)) {
        if (marker) next = unsigned(std::stoul(word));
        size_t q0 = row.find('"'), q1 = row.rfind('"');  // the file name may hold spaces
        if (q0 != std::string::npos && q1 > q0) file = row.substr(q0 + 1, q1 - q0 - 1);
        line = next;
      } else {
        ++line;
      }
      if (end == text.size()) break;
      start = end + 1;
    }
  }
  std::string where(size_t offset) const {
    auto [file, line] = file_line(offset);
    return file + ":" + std::to_string(line);
  }
  std::pair<std::string, unsigned> file_line(size_t offset) const {
    auto it = std::upper_bound(lines_.begin(), lines_.end(), offset,
                               [](size_t o, const Line& l) { return o < l.start; });
    return {(it - 1)->file, (it - 1)->line};
  }

 private:
  struct Line {
    size_t start;
    std::string file;
    unsigned line;
  };
  std::vector<Line> lines_;
};

// Expressions for the position builtins, over `L` (Launch) and `T` (ThreadIds).
const std::map<std::string, std::string>& builtin_expressions() {
  static const std::map<std::string, std::string> m = {
      {"thread_position_in_grid", "T->thread_position_in_grid"},
      {"thread_position_in_threadgroup", "T->thread_position_in_threadgroup"},
      {"threadgroup_position_in_grid", "T->threadgroup_position_in_grid"},
      {"threads_per_threadgroup", "T->threads_per_threadgroup"},
      {"threadgroups_per_grid", "L->threadgroups_per_grid"},
      {"threads_per_grid", "L->threads_per_grid"},
      {"dispatch_threads_per_threadgroup", "L->dispatch_threads_per_threadgroup"},
      {"thread_index_in_threadgroup", "T->thread_index_in_threadgroup"},
      {"thread_index_in_simdgroup", "T->thread_index_in_simdgroup"},
      {"simdgroup_index_in_threadgroup", "T->simdgroup_index_in_threadgroup"},
      {"simdgroups_per_threadgroup", "T->simdgroups_per_threadgroup"},
      {"threads_per_simdgroup", "T->threads_per_simdgroup"},
      {"thread_execution_width", "T->threads_per_simdgroup"},
      {"thread_index_in_quadgroup", "(T->thread_index_in_threadgroup % 4u)"},
      {"quadgroup_index_in_threadgroup", "(T->thread_index_in_threadgroup / 4u)"},
  };
  return m;
}

struct KernelParam {
  std::string name, type, call_arg, info;
};

struct KernelDecl {
  std::string name;  // the pipeline's function name ([[host_name]] for template instantiations)
  std::string call;  // what the entry point calls: f or f<args>
  std::string max_threads = "(mq_abi::kMaxThreadsPerThreadgroup)", file;
  unsigned line = 0;
  std::vector<KernelParam> params;
};

// Splits a parameter list at top-level commas; returns [begin, end) ranges.
std::vector<std::pair<size_t, size_t>> split_params(const std::string& m, size_t begin, size_t end) {
  std::vector<std::pair<size_t, size_t>> out;
  int depth = 0;
  size_t start = begin;
  for (size_t i = begin; i < end; ++i) {
    char c = m[i];
    if (c == '(' || c == '[' || c == '<' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '>' || c == '}') --depth;
    if (c == ',' && depth == 0) {
      out.push_back({start, i});
      start = i + 1;
    }
  }
  if (!trim(m.substr(begin, end - begin)).empty()) out.push_back({start, end});
  return out;
}

// `type` replaces the declared type in the generated code (e.g. the parameter's type in an
// instance's function type, where the declared one names template parameters).
KernelParam parse_param(const std::string& text, const std::string& kernel, const std::string& where,
                        const std::string& type = "") {
  const std::string ctx = where + ": kernel '" + kernel + "'";
  size_t a = text.find("[[");
  size_t b = text.find("]]", a == std::string::npos ? 0 : a);
  if (a == std::string::npos || b == std::string::npos)
    refuse(ctx, "parameter '" + trim(text) + "' has no [[attribute]]");
  std::string attr = trim(text.substr(a + 2, b - a - 2));
  std::string decl = trim(text.substr(0, a) + text.substr(b + 2));
  size_t name_end = decl.size();
  size_t name_begin = name_end;
  while (name_begin > 0 && is_ident_char(decl[name_begin - 1])) --name_begin;
  KernelParam p;
  p.name = decl.substr(name_begin);
  p.type = trim(decl.substr(0, name_begin));
  if (p.name.empty() || p.type.empty()) refuse(ctx, "cannot read parameter '" + decl + "'");
  const bool pointer = p.type.back() == '*', reference = p.type.back() == '&';
  if (!type.empty()) p.type = type;
  std::string attr_name = attr.substr(0, attr.find('('));
  attr_name = trim(attr_name);
  auto index_of = [&]() {
    size_t open = attr.find('('), close = attr.find(')');
    std::string n = open == std::string::npos ? "" : trim(attr.substr(open + 1, close - open - 1));
    if (n.empty() || !std::all_of(n.begin(), n.end(), ::isdigit)) refuse(ctx, "bad attribute [[" + attr + "]]");
    unsigned index = unsigned(std::stoul(n));
    if (index >= 31) refuse(ctx, "[[" + attr + "]]: index must be below 31");
    return std::to_string(index);
  };
  const std::string q = "\"" + p.name + "\"";
  if (attr_name == "buffer") {
    std::string idx = index_of();
    if (pointer) {
      p.call_arg = "(" + p.type + ")L->buffers[" + idx + "]";
      p.info = "{" + q + ", mq_abi::ParamKind::buffer_pointer, " + idx + ", 0, mq_glue_read_only<" + p.type + ">}";
    } else if (reference) {
      p.call_arg = "mq_glue_ref<" + p.type + ">(L->buffers[" + idx + "])";
      p.info = "{" + q + ", mq_abi::ParamKind::buffer_reference, " + idx + ", sizeof(mq_glue_pointee_t<" + p.type +
               ">), mq_glue_read_only<" + p.type + ">}";
    } else {
      refuse(ctx, "buffer parameter '" + p.name + "' must be a pointer or a reference");
    }
  } else if (attr_name == "threadgroup") {
    std::string idx = index_of();
    if (!pointer) refuse(ctx, "threadgroup parameter '" + p.name + "' must be a pointer");
    p.call_arg = "(" + p.type + ")L->threadgroup_buffers[" + idx + "]";
    p.info = "{" + q + ", mq_abi::ParamKind::threadgroup_pointer, " + idx + ", 0, 0}";
  } else {
    auto it = builtin_expressions().find(attr);
    if (it == builtin_expressions().end())
      refuse(ctx, "attribute [[" + attr + "]] of '" + p.name + "' is not supported by the CPU runtime");
    p.call_arg = "mq_glue_builtin<" + p.type + ">(" + it->second + ")";
  }
  return p;
}

// The text of adjacent plain string literals (`"qmv_b" "4"` from macro stringising and
// concatenation), or "" when `arg` is anything else.
std::string string_literal_text(const std::string& arg) {
  std::string text;
  for (size_t i = skip_space(arg, 0); i < arg.size(); i = skip_space(arg, i)) {
    size_t close = arg[i] == '"' ? arg.find('"', i + 1) : std::string::npos;
    if (close == std::string::npos) return "";
    text += arg.substr(i + 1, close - i - 1);
    i = close + 1;
  }
  return text;
}

// True when the text ending at `end` is a `template <...>` header.
bool follows_template_header(const std::string& m, size_t end) {
  if (end == 0 || m[end - 1] != '>') return false;
  int depth = 0;
  size_t i = end;
  while (i-- > 0) {
    depth += m[i] == '>' ? 1 : m[i] == '<' ? -1 : 0;
    if (depth == 0) break;
  }
  while (i > 0 && std::isspace(static_cast<unsigned char>(m[i - 1]))) --i;
  return i >= 8 && m.compare(i - 8, 8, "template") == 0 && (i == 8 || !is_ident_char(m[i - 9]));
}

// Pass 1: kernel signatures become plain static functions (attributes blanked,
// same line count); returns their declarations for the entry points.
std::string rewrite_kernels(const std::string& text, const LineMap& lines, std::vector<KernelDecl>& kernels) {
  const std::string m = mask_comments_and_strings(text);
  std::vector<Edit> edits;
  // A template definition's [[max_total_threads_per_threadgroup]] applies to its
  // instantiations (as on Metal) unless one declares its own.
  std::map<std::string, std::string> template_max_threads;
  auto set_max_threads = [&](KernelDecl& k, const std::string& function, const std::string& own) {
    if (!own.empty()) k.max_threads = own;
    else if (auto inherited = template_max_threads.find(function); inherited != template_max_threads.end())
      k.max_threads = inherited->second;
  };
  // Each template definition's parameter texts, for its `decltype` instances.
  std::map<std::string, std::vector<std::string>> template_params;
  for (size_t at : find_word(m, "kernel")) {
    const std::string where = lines.where(at);
    size_t keyword_end = at + 6;
    const bool bracketed = at >= 2 && m.compare(at - 2, 2, "[[") == 0;  // [[kernel]] void f(...)
    if (bracketed && m.compare(keyword_end, 2, "]]") != 0) continue;
    const size_t keyword_begin = bracketed ? at - 2 : at;
    keyword_end += bracketed ? 2 : 0;
    KernelDecl k;
    std::tie(k.file, k.line) = lines.file_line(at);
    // Attributes in front: [[max_total_threads_per_threadgroup(N)]], [[host_name("x")]].
    std::string host_name, own_max_threads;
    size_t before = keyword_begin;
    for (;;) {
      while (before > 0 && std::isspace(static_cast<unsigned char>(m[before - 1]))) --before;
      if (before < 2 || m.compare(before - 2, 2, "]]") != 0) break;
      size_t open = m.rfind("[[", before - 2);
      std::string attr = trim(text.substr(open + 2, before - 2 - open - 2));
      size_t p0 = attr.find('('), p1 = attr.rfind(')');
      std::string attr_name = trim(attr.substr(0, p0)),
                  arg = p0 == std::string::npos ? "" : trim(attr.substr(p0 + 1, p1 - p0 - 1));
      if (attr_name == "max_total_threads_per_threadgroup") {
        own_max_threads = "(" + arg + ")";
      } else if (attr_name == "host_name") {
        host_name = string_literal_text(arg);
        if (host_name.empty() || !std::all_of(host_name.begin(), host_name.end(), is_ident_char))
          refuse(where, "[[host_name]] must name a C identifier, got [[" + attr + "]]");
      } else {
        refuse(where, "attribute [[" + attr + "]] on a kernel is not supported by the CPU runtime");
      }
      edits.push_back({open, before - open, blanked(text.substr(open, before - open))});
      before = open;
    }
    // `template <...> kernel void f(...) {` defines a template: entry points come from
    // its explicit instantiations `template [[host_name("f_4")]] kernel void f<4>(...);`.
    const bool template_definition = follows_template_header(m, before);
    size_t i = skip_space(m, keyword_end);
    if (m.compare(i, 8, "decltype") == 0 && !is_ident_char(m[i + 8])) {
      // `template [[host_name("f_4")]] [[kernel]] decltype(f<4>) f<4>;` (MLX's form): the
      // instance's signature is its template's, parameter types taken from the function type.
      const size_t open = skip_space(m, i + 8);
      if (m[open] != '(') refuse(where, "expected '(' after decltype");
      i = skip_space(m, match_bracket(m, open, where));
      const size_t name_end = ident_end(m, i);
      const std::string function = m.substr(i, name_end - i);
      i = skip_space(m, name_end);
      size_t args_end = i;
      for (int depth = 0; args_end < m.size(); ++args_end) {
        depth += m[args_end] == '<' ? 1 : m[args_end] == '>' ? -1 : 0;
        if (depth == 0) break;
      }
      if (function.empty() || m[i] != '<' || args_end >= m.size() || m[skip_space(m, args_end + 1)] != ';')
        refuse(where, "expected `decltype(f<...>) f<...>;` after [[kernel]]");
      auto params = template_params.find(function);
      if (params == template_params.end())
        refuse(where, "kernel instance of '" + function + "' has no kernel template defined before it");
      if (host_name.empty()) refuse(where, "kernel instance of '" + function + "' needs [[host_name(\"...\")]]");
      edits.push_back({keyword_begin, keyword_end - keyword_begin, std::string(keyword_end - keyword_begin, ' ')});
      k.name = host_name;
      k.call = function + text.substr(i, args_end + 1 - i);
      for (size_t n = 0; n < params->second.size(); ++n)
        k.params.push_back(parse_param(params->second[n], k.name, where,
                                       "mq_glue_param_t<decltype(" + k.call + "), " + std::to_string(n) + ">"));
      set_max_threads(k, function, own_max_threads);
      kernels.push_back(std::move(k));
      continue;
    }
    if (m.compare(i, 4, "void") != 0) refuse(where, "a kernel must return void");
    i = skip_space(m, i + 4);
    size_t name_end = ident_end(m, i);
    std::string function = m.substr(i, name_end - i);
    if (function.empty()) refuse(where, "kernel without a name");
    i = skip_space(m, name_end);
    std::string template_args;
    if (m[i] == '<') {
      int depth = 0;
      size_t j = i;
      for (; j < m.size(); ++j) {
        depth += m[j] == '<' ? 1 : m[j] == '>' ? -1 : 0;
        if (depth == 0) break;
      }
      template_args = text.substr(i, j + 1 - i);
      i = skip_space(m, j + 1);
    }
    if (m[i] != '(') refuse(where, "kernel '" + function + "': expected '('");
    size_t close = match_bracket(m, i, where) - 1;
    const bool instantiation = !template_args.empty();
    if (instantiation && host_name.empty())
      refuse(where, "explicit kernel instantiation '" + function + template_args + "' needs [[host_name(\"...\")]]");
    // Explicit instantiations take no storage class: drop the keyword there.
    edits.push_back({keyword_begin, keyword_end - keyword_begin,
                     instantiation ? std::string(keyword_end - keyword_begin, ' ')
                                   : std::string(keyword_end - keyword_begin - 6, ' ') + "static"});
    k.name = instantiation ? host_name : function;
    k.call = function + template_args;
    for (auto [a, b] : split_params(m, i + 1, close)) {
      k.params.push_back(parse_param(text.substr(a, b - a), k.name, lines.where(a)));
      if (template_definition) template_params[function].push_back(text.substr(a, b - a));
      for (size_t s = m.find("[[", a); s != std::string::npos && s < b; s = m.find("[[", s + 2)) {
        size_t e = m.find("]]", s) + 2;
        edits.push_back({s, e - s, blanked(text.substr(s, e - s))});
      }
    }
    if (template_definition) {
      if (!own_max_threads.empty()) template_max_threads[function] = own_max_threads;
      continue;
    }
    set_max_threads(k, function, own_max_threads);
    kernels.push_back(std::move(k));
  }
  return apply_edits(text, std::move(edits));
}

// Pass 2: `threadgroup T name[N]...;` inside a kernel becomes a reference to the
// group's shared memory, allocated by the runtime per declaration site.
std::string rewrite_threadgroup_arrays(const std::string& text, const LineMap& lines) {
  const std::string m = mask_comments_and_strings(text);
  std::vector<Edit> edits;
  for (size_t at : find_word(m, "threadgroup")) {
    size_t start = skip_space(m, at + 11);
    if (start == at + 11 || start >= m.size() || !is_ident_start(m[start])) continue;
    // An array when '[' comes before any pointer/reference/call syntax; its sizes may
    // hold any expression, so the statement ends at the next ';' outside brackets.
    size_t end = m.find_first_of(";{}()*&,[", start);
    if (end != std::string::npos && m[end] == '[') {
      for (int depth = 0; end < m.size() && !(depth == 0 && (m[end] == ';' || m[end] == ',')); ++end)
        depth += m[end] == '[' || m[end] == '(' ? 1 : m[end] == ']' || m[end] == ')' ? -1 : 0;
    }
    if (end == std::string::npos || end >= m.size() || m[end] != ';') {
      if (end < m.size() && m[end] == ',') refuse(lines.where(at), "declare one threadgroup variable per statement");
      continue;  // a pointer, reference or parameter: plain memory on the CPU
    }
    std::string decl = trim(text.substr(start, end - start));
    size_t dims = decl.find('[');
    std::string head = trim(decl.substr(0, dims));
    std::string dim_text = dims == std::string::npos ? "" : decl.substr(dims);
    size_t name_begin = head.size();
    while (name_begin > 0 && is_ident_char(head[name_begin - 1])) --name_begin;
    std::string name = head.substr(name_begin), type = trim(head.substr(0, name_begin));
    if (name.empty() || type.empty()) refuse(lines.where(at), "cannot read threadgroup declaration '" + decl + "'");
    std::string key = "mq_tg_key_" + name, alias = "mq_tg_type_" + name;
    // The key is the variable's name: a unique object per declaration that error reports can print.
    std::string replacement = "static const char " + key + "[] = \"" + name + "\"; using " + alias + " = " + type +
                              " " + dim_text + "; " + alias + "& " + name + " = *static_cast<" + alias +
                              "*>(mq_tg_alloc(" + key + ", sizeof(" + alias + "), alignof(" + alias + ")));";
    std::string original = text.substr(at, end + 1 - at);
    replacement += std::string(std::count(original.begin(), original.end(), '\n'), '\n');
    edits.push_back({at, end + 1 - at, replacement});
  }
  return apply_edits(text, std::move(edits));
}

bool is_swizzle(const std::string& s) {
  if (s.size() < 2 || s.size() > 4) return false;
  return s.find_first_not_of("xyzw") == std::string::npos || s.find_first_not_of("rgba") == std::string::npos;
}

int swizzle_index(char c) {
  switch (c) {
    case 'x':
    case 'r': return 0;
    case 'y':
    case 'g': return 1;
    case 'z':
    case 'b': return 2;
    default: return 3;
  }
}

bool assigns_after(const std::string& m, size_t i) {
  i = skip_space(m, i);
  if (i >= m.size()) return false;
  if (m[i] == '=') return i + 1 >= m.size() || m[i + 1] != '=';
  static const char* ops[] = {"+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>="};
  for (const char* op : ops)
    if (m.compare(i, std::string(op).size(), op) == 0) return true;
  return false;
}

// Pass 3: half literals (1.5h) and multi-component swizzles (v.xy), which C++
// has no syntax for.
std::string rewrite_literals_and_swizzles(const std::string& text) {
  const std::string m = mask_comments_and_strings(text);
  std::vector<Edit> edits;
  for (size_t i = 0; i < m.size();) {
    char c = m[i];
    bool starts_number = std::isdigit(static_cast<unsigned char>(c)) ||
                         (c == '.' && i + 1 < m.size() && std::isdigit(static_cast<unsigned char>(m[i + 1])));
    if (starts_number && (i == 0 || (!is_ident_char(m[i - 1]) && m[i - 1] != '.'))) {
      size_t e = i;
      while (e < m.size() && (is_ident_char(m[e]) || m[e] == '.' ||
                              ((m[e] == '+' || m[e] == '-') && (m[e - 1] == 'e' || m[e - 1] == 'E'))))
        ++e;
      std::string token = m.substr(i, e - i);
      bool hex = token.size() > 1 && (token[1] == 'x' || token[1] == 'X');
      if (!hex && (token.back() == 'h' || token.back() == 'H')) {
        std::string number = token.substr(0, token.size() - 1);
        if (number.find_first_of(".eE") == std::string::npos) number += ".0";
        edits.push_back({i, token.size(), "((half)" + number + ")"});
      }
      i = e;
      continue;
    }
    if (c == '.' && i > 0 && (is_ident_char(m[i - 1]) || m[i - 1] == ')' || m[i - 1] == ']')) {
      size_t e = ident_end(m, i + 1);
      std::string member = m.substr(i + 1, e - i - 1);
      if (is_swizzle(member) && skip_space(m, e) < m.size() && m[skip_space(m, e)] != '(') {
        std::string indices;
        for (char s : member) indices += (indices.empty() ? "" : ",") + std::to_string(swizzle_index(s));
        const char* fn = assigns_after(m, e) ? "mq_swz_ref" : "mq_swz";
        edits.push_back({i, e - i, std::string(".template ") + fn + "<" + indices + ">()"});
      }
      i = e;
      continue;
    }
    ++i;
  }
  return apply_edits(text, std::move(edits));
}

std::string entry_points(const std::vector<KernelDecl>& kernels) {
  std::ostringstream o;
  o << "\n#line 1 \"<metalqwen kernel entry points>\"\n";
  for (const KernelDecl& k : kernels) {
    o << "extern \"C\" MQ_UNCHECKED void mq_entry_" << k.name
      << "(const mq_abi::Launch* L, const mq_abi::ThreadIds* T) {\n  " << k.call << "(";
    for (size_t i = 0; i < k.params.size(); ++i) o << (i ? ",\n    " : "") << k.params[i].call_arg;
    o << ");\n  (void)L; (void)T;\n}\n";
    size_t infos = 0;
    for (const KernelParam& p : k.params) infos += !p.info.empty();
    if (infos) {
      o << "static const mq_abi::ParamInfo mq_params_" << k.name << "[] = {";
      for (const KernelParam& p : k.params)
        if (!p.info.empty()) o << "\n  " << p.info << ",";
      o << "\n};\n";
    }
  }
  o << "static const mq_abi::KernelInfo mq_kernel_table[] = {";
  for (const KernelDecl& k : kernels) {
    size_t infos = 0;
    for (const KernelParam& p : k.params) infos += !p.info.empty();
    o << "\n  {\"" << k.name << "\", &mq_entry_" << k.name << ", uint32_t" << k.max_threads << ", " << infos << ", "
      << (infos ? "mq_params_" + k.name : std::string("nullptr")) << ", \"" << k.file << "\", " << k.line << "},";
  }
  if (kernels.empty()) o << "\n  {\"\", nullptr, 0, 0, nullptr, \"\", 0},";
  o << "\n};\n"
    << "extern \"C\" const mq_abi::LibraryExports mq_library_exports = {mq_abi::kAbiVersion, " << kernels.size()
    << ", mq_kernel_table, &mq_glue_bind_runtime};\n";
  return o.str();
}

}  // namespace

TranslatedSource translate_msl(const std::string& source, const std::string& source_name) {
  std::string text = "#line 1 \"" + source_name + "\"\n" + source;
  LineMap lines(text, source_name);
  std::vector<KernelDecl> kernels;
  text = rewrite_kernels(text, lines, kernels);
  text = rewrite_threadgroup_arrays(text, lines);
  text = rewrite_literals_and_swizzles(text);
  std::map<std::string, int> seen;
  for (const KernelDecl& k : kernels)
    if (seen[k.name]++) refuse(k.file + ":" + std::to_string(k.line), "kernel '" + k.name + "' is defined twice");
  TranslatedSource out;
  // The real compatibility header comes first: the preprocessing pass left the
  // source's own #include <metal_stdlib> empty.
  out.cpp = "#include <metal_stdlib>\n" + text + entry_points(kernels);
  for (const KernelDecl& k : kernels) out.kernel_names.push_back(k.name);
  return out;
}

}  // namespace mq::cpu
