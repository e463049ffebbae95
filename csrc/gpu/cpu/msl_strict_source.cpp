#include "msl_strict_source.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <vector>

#include "msl_text.h"

namespace mq::cpu {
namespace {

// Attributes the MSL specification defines (functions, arguments, kernel builtins);
// anything else in [[...]] stays for clang, which rejects it (-Werror=unknown-attributes).
const std::set<std::string>& metal_attributes() {
  static const std::set<std::string> names = {"kernel",
                                              "vertex",
                                              "fragment",
                                              "visible",
                                              "stitchable",
                                              "host_name",
                                              "max_total_threads_per_threadgroup",
                                              "buffer",
                                              "texture",
                                              "sampler",
                                              "threadgroup",
                                              "function_constant",
                                              "stage_in",
                                              "id",
                                              "user",
                                              "thread_position_in_grid",
                                              "thread_position_in_threadgroup",
                                              "threadgroup_position_in_grid",
                                              "threads_per_threadgroup",
                                              "threadgroups_per_grid",
                                              "threads_per_grid",
                                              "dispatch_threads_per_threadgroup",
                                              "thread_index_in_threadgroup",
                                              "thread_index_in_simdgroup",
                                              "simdgroup_index_in_threadgroup",
                                              "simdgroups_per_threadgroup",
                                              "dispatch_simdgroups_per_threadgroup",
                                              "threads_per_simdgroup",
                                              "thread_execution_width",
                                              "thread_index_in_quadgroup",
                                              "quadgroup_index_in_threadgroup",
                                              "quadgroups_per_threadgroup",
                                              "dispatch_quadgroups_per_threadgroup",
                                              "grid_origin",
                                              "grid_size"};
  return names;
}

// Scalar types whose 2-, 3- and 4-vectors the stub declares (metal_stdlib in msl_strict/).
const std::set<std::string>& vector_element_types() {
  static const std::set<std::string> names = {"char", "uchar", "short", "ushort", "int",   "uint",
                                              "long", "ulong", "half",  "float",  "bfloat"};
  return names;
}

// Index of the bracket closing the one at `open`, or npos.
size_t closing_bracket(const std::string& m, size_t open) {
  int depth = 0;
  for (size_t i = open; i < m.size(); ++i) {
    depth += (m[i] == '(' || m[i] == '[' || m[i] == '{') - (m[i] == ')' || m[i] == ']' || m[i] == '}');
    if (depth == 0) return i;
  }
  return std::string::npos;
}

void blank(std::string& m, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i)
    if (m[i] != '\n') m[i] = ' ';
}

struct Edit {
  size_t pos, len;
  std::string text;
};

// Blanks the Metal items of every [[...]] list in `out` and `m` alike; returns where
// each [[kernel]]'s list ended.
std::vector<size_t> remove_metal_attributes(std::string& out, std::string& m) {
  std::vector<size_t> kernels;
  for (size_t open = m.find("[["); open != std::string::npos; open = m.find("[[", open + 2)) {
    const size_t close = m.find("]]", open + 2);
    if (close == std::string::npos) break;
    size_t item = open + 2;
    for (size_t i = item; i <= close; ++i) {
      if (i < close && m[i] == '(') i = std::min(closing_bracket(m, i), close - 1);
      if (i != close && m[i] != ',') continue;
      const size_t name_begin = skip_space(m, item);
      size_t name_end = name_begin;
      while (name_end < i && (is_ident_char(m[name_end]) || m[name_end] == ':')) ++name_end;
      const std::string name = m.substr(name_begin, name_end - name_begin);
      if (metal_attributes().count(name)) {
        if (name == "kernel") kernels.push_back(close + 2);
        blank(out, item, i);
        blank(m, item, i);
      }
      item = i + 1;
    }
    if (m.substr(open + 2, close - open - 2).find_first_not_of(" \n,") == std::string::npos) {
      blank(out, open, close + 2);
      blank(m, open, close + 2);
    }
  }
  return kernels;
}

// Where a kernel's declaration continues after its [[kernel]] or `kernel` (`after`), its
// parameter list (brackets) and body (braces; npos for a declaration or an instantiation).
struct KernelSpan {
  size_t after, params_open, params_close, body_open, body_close;
};

// `afters` are the ends of the [[kernel]] lists (already blanked); `kernel` keywords are
// found here and blanked in `out` and `m`, so that neither pass needs a `kernel` macro.
std::vector<KernelSpan> find_kernels(std::string& out, std::string& m, std::vector<size_t> afters) {
  for (size_t at : find_word(m, "kernel")) {
    blank(out, at, at + 6);
    blank(m, at, at + 6);
    afters.push_back(at + 6);
  }
  std::vector<KernelSpan> kernels;
  for (size_t after : afters) {
    const size_t params = m.find('(', after);
    const size_t params_end = params == std::string::npos ? params : closing_bracket(m, params);
    if (params_end == std::string::npos) continue;
    const size_t body = skip_space(m, params_end + 1);
    const bool defined = body < m.size() && m[body] == '{';
    kernels.push_back({after, params, params_end, defined ? body : std::string::npos,
                       defined ? closing_bracket(m, body) : std::string::npos});
  }
  return kernels;
}

// Where the name before the parameter list at `params_open` starts (with its template
// arguments, as in an explicit instantiation `f<half>(...)`).
size_t declarator_name_begin(const std::string& m, size_t params_open) {
  size_t i = params_open;
  while (i > 0 && std::isspace(static_cast<unsigned char>(m[i - 1]))) --i;
  if (i > 0 && m[i - 1] == '>') {
    for (int depth = 0; i > 0;) {
      --i;
      depth += (m[i] == '>') - (m[i] == '<');
      if (depth == 0) break;
    }
    while (i > 0 && std::isspace(static_cast<unsigned char>(m[i - 1]))) --i;
  }
  while (i > 0 && (is_ident_char(m[i - 1]) || m[i - 1] == ':')) --i;
  return i;
}

// A kernel returns void: its return type T is written
// mq_kernel_result<T, sizeof(mq_kernel_must_return_void<T>)>, and the stub completes that
// class only for void (and for a function type returning void, which the instantiation form
// `[[kernel]] decltype(f<A>) f<A>;` declares), so clang rejects any other at its line.
void mark_kernel_return_types(const std::string& text, const std::string& m, const std::vector<KernelSpan>& kernels,
                              std::vector<Edit>& edits) {
  for (const KernelSpan& k : kernels) {
    size_t begin = skip_space(m, k.after);
    while (m.compare(begin, 2, "[[") == 0) begin = skip_space(m, m.find("]]", begin) + 2);  // other attributes
    size_t end = std::string::npos;
    if (m.compare(begin, 8, "decltype") == 0 && begin + 8 <= k.params_open && skip_space(m, begin + 8) == k.params_open)
      end = k.params_close + 1;
    else if (k.params_open > begin) end = declarator_name_begin(m, k.params_open);
    while (end != std::string::npos && end > begin && std::isspace(static_cast<unsigned char>(m[end - 1]))) --end;
    if (end == std::string::npos || end <= begin) continue;
    std::string type = text.substr(begin, end - begin);
    std::replace(type.begin(), type.end(), '\n', ' ');  // the copy must not add lines
    edits.push_back({end, 0, ", sizeof(mq_kernel_must_return_void<" + type + ">)>"});
    edits.push_back({begin, 0, "mq_kernel_result<"});
  }
}

// Metal requires an address space on every pointer or reference parameter of a kernel.
void mark_unqualified_kernel_pointers(const std::string& m, const std::vector<KernelSpan>& kernels,
                                      std::vector<Edit>& edits) {
  for (const KernelSpan& k : kernels) {
    for (size_t begin = k.params_open + 1; begin < k.params_close;) {
      size_t end = begin;
      for (int depth = 0; end < k.params_close && !(depth == 0 && m[end] == ','); ++end)
        depth += (m[end] == '(' || m[end] == '<' || m[end] == '[') - (m[end] == ')' || m[end] == '>' || m[end] == ']');
      const std::string param = m.substr(begin, end - begin);
      const bool indirect = param.find_first_of("*&") != std::string::npos;
      const bool qualified = !find_word(param, "device").empty() || !find_word(param, "constant").empty() ||
                             !find_word(param, "threadgroup").empty();
      if (indirect && !qualified)
        edits.push_back({skip_space(m, begin), 0,
                         "_Pragma(\"GCC error \\\"a kernel's pointer and reference parameters need device, constant or "
                         "threadgroup\\\"\") "});
      begin = end + 1;
    }
  }
}

// Where the declaration of a threadgroup variable starting at `at` ends (its ';'), or npos
// for a pointer, reference, cast or parameter. `simple` when it is one variable without initializer.
size_t threadgroup_variable_end(const std::string& m, size_t at, bool& simple) {
  size_t before = at;
  while (before > 0 && std::isspace(static_cast<unsigned char>(m[before - 1]))) --before;
  if (before > 0 && (m[before - 1] == '(' || m[before - 1] == ',' || m[before - 1] == '<')) return std::string::npos;
  int angle = 0;
  size_t i = at + 11;
  for (; i < m.size(); ++i) {
    const char c = m[i];
    angle += (c == '<') - (c == '>');
    if (angle > 0) continue;
    if (c == '[' || c == ';' || c == '=' || c == ',') break;
    if (c == '*' || c == '&' || c == '(' || c == ')' || c == '{' || c == '}') return std::string::npos;
  }
  simple = true;
  for (int depth = 0; i < m.size() && !(depth == 0 && m[i] == ';'); ++i) {
    depth += (m[i] == '[' || m[i] == '(' || m[i] == '{') - (m[i] == ']' || m[i] == ')' || m[i] == '}');
    if (depth == 0 && (m[i] == '=' || m[i] == ',')) simple = false;
  }
  return i < m.size() ? i : std::string::npos;
}

// `threadgroup T name[N];` in a kernel becomes a reference to memory clang never has to
// construct (it cannot construct a class object in an address space), keeping its lines.
std::string threadgroup_reference(const std::string& text, size_t at, size_t end) {
  const std::string decl = text.substr(at + 11, end - at - 11);
  const size_t dims = std::min(decl.find('['), decl.size());
  size_t name_begin = decl.find_last_not_of(" \t\n", dims == 0 ? 0 : dims - 1);
  const size_t name_end = name_begin + 1;
  while (name_begin > 0 && is_ident_char(decl[name_begin - 1])) --name_begin;
  const std::string name = decl.substr(name_begin, name_end - name_begin);
  const std::string alias = "mq_threadgroup_" + name;
  std::string out = "typedef threadgroup " + decl.substr(0, name_begin) + alias + decl.substr(dims) + "; " + alias +
                    "& " + name + " = mq_threadgroup_variable<" + alias + ">();";
  for (char c : decl) out += c == '\n' ? "\n" : "";
  return out;
}

void mark_threadgroup_variables(const std::string& text, const std::string& m, const std::vector<KernelSpan>& kernels,
                                std::vector<Edit>& edits) {
  for (size_t at : find_word(m, "threadgroup")) {
    bool simple = false;
    const size_t end = threadgroup_variable_end(m, at, simple);
    if (end == std::string::npos) continue;
    const bool in_kernel = std::any_of(kernels.begin(), kernels.end(),
                                       [&](const KernelSpan& k) { return k.body_open < at && at < k.body_close; });
    if (!in_kernel)
      edits.push_back({at, 0,
                       "_Pragma(\"GCC error \\\"a threadgroup variable must be declared in a kernel function\\\"\") "});
    else if (simple) edits.push_back({at, end + 1 - at, threadgroup_reference(text, at, end)});
    else edits.push_back({at, 11, "mq_threadgroup_static"});  // clang checks the initializer or the list
  }
}

void mark_vector_constructors(const std::string& m, std::vector<Edit>& edits) {
  for (size_t i = 0; i < m.size(); ++i) {
    if (!is_ident_char(m[i]) || (i > 0 && is_ident_char(m[i - 1]))) continue;
    size_t end = i;
    while (end < m.size() && is_ident_char(m[end])) ++end;
    const size_t packed = m.compare(i, 7, "packed_") == 0 ? 7 : 0;  // packed_float3(...) as float3(...)
    const std::string word = m.substr(i + packed, end - i - packed);
    const char last = word.empty() ? ' ' : word.back();
    const bool vector = word.size() > 1 && last >= '2' && last <= '4' &&
                        vector_element_types().count(word.substr(0, word.size() - 1));
    size_t before = i;
    while (before > 0 && std::isspace(static_cast<unsigned char>(m[before - 1]))) --before;
    const bool member = before > 0 && (m[before - 1] == '.' || (before > 1 && (m.compare(before - 2, 2, "::") == 0 ||
                                                                               m.compare(before - 2, 2, "->") == 0)));
    const size_t next = skip_space(m, end);
    if (vector && !member && next < m.size() && m[next] == '(') edits.push_back({i, packed, "mq_make_"});
    i = end;
  }
}

// Metal's `1.5H` is `1.5h`; C++14 knows only the lower-case suffix (std::chrono's).
void mark_upper_case_half_literals(const std::string& m, std::vector<Edit>& edits) {
  for (size_t i = 0; i < m.size(); ++i) {
    const bool starts_number = std::isdigit(static_cast<unsigned char>(m[i])) ||
                               (m[i] == '.' && i + 1 < m.size() && std::isdigit(static_cast<unsigned char>(m[i + 1])));
    if (!starts_number || (i > 0 && (is_ident_char(m[i - 1]) || m[i - 1] == '.'))) continue;
    size_t end = i;
    while (end < m.size() && (is_ident_char(m[end]) || m[end] == '.' ||
                              ((m[end] == '+' || m[end] == '-') && (m[end - 1] == 'e' || m[end - 1] == 'E'))))
      ++end;
    const bool hex = end - i > 1 && (m[i + 1] == 'x' || m[i + 1] == 'X');
    if (!hex && m[end - 1] == 'H') edits.push_back({end - 1, 1, "h"});
    i = end;
  }
}

}  // namespace

std::string strict_check_source(const std::string& preprocessed_msl) {
  std::string out = preprocessed_msl;
  std::string m = mask_comments_and_strings(out);
  const std::vector<size_t> bracketed_kernels = remove_metal_attributes(out, m);
  const std::vector<KernelSpan> kernels = find_kernels(out, m, bracketed_kernels);
  std::vector<Edit> edits;
  mark_kernel_return_types(out, m, kernels, edits);
  mark_unqualified_kernel_pointers(m, kernels, edits);
  mark_threadgroup_variables(out, m, kernels, edits);
  mark_vector_constructors(m, edits);
  mark_upper_case_half_literals(m, edits);
  std::stable_sort(edits.begin(), edits.end(), [](const Edit& a, const Edit& b) { return a.pos > b.pos; });
  for (const Edit& e : edits) out.replace(e.pos, e.len, e.text);
  return "#include <metal_stdlib>\n" + out;
}

}  // namespace mq::cpu
