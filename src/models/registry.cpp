// The list of supported families: the only one.
#include "core/error.h"
#include "models/family.h"

namespace ingot {

extern const Family kLlamaFamily;
extern const Family kQwen2Family;
extern const Family kQwen3Family;
extern const Family kQwen3_5TextFamily;
extern const Family kQwen3_5Family;

const Family& find_family(const std::string& model_type, const std::string& where) {
  static const Family* const kAll[] = {&kLlamaFamily, &kQwen2Family, &kQwen3Family, &kQwen3_5TextFamily,
                                          &kQwen3_5Family};
  std::string names;
  for (const Family* f : kAll) {
    if (model_type == f->model_type) return *f;
    names += std::string(names.empty() ? "" : ", ") + f->model_type;
  }
  throw Error((where.empty() ? "" : where + ": ") + "model_type '" + model_type + "' is not supported (supported: " +
              names + ")");
}

}  // namespace ingot
