#include <flashrt/decisions.h>
#include <flashrt/errors.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace frt {
namespace {

// A file of this process and test alone (ctest runs the tests as processes side by side).
std::string write(const std::string& text) {
  static int serial = 0;
  const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("frt_decisions_" + std::to_string(::getpid()) + "_" + name + "_" +
                             std::to_string(serial++) + ".json"))
                               .string();
  std::ofstream(path) << text;
  return path;
}

CpuFeatures cpu() {
  CpuFeatures c;
  c.arch = "x86_64";
  c.os = "linux";
  c.model = "Test CPU (family 6 model 1 stepping 0)";
  c.features = {"avx2", "fma", "f16c"};
  return c;
}

std::string doc(const std::string& model, const std::string& tier, const std::string& forms) {
  return R"({"schema": "flashrt-decisions/1", "cpu": ")" + model + R"(", "tier": ")" + tier +
         R"(", "forms": )" + forms + "}";
}

TEST(DecisionsTest, ThisMachinesFileGivesItsBands) {
  const std::string path =
      write(doc(cpu().model, "avx2", R"({"int8_rows": {"rows_min": 24, "rule": "..."}})"));
  const MachineDecisions d = read_decisions(path, cpu());
  EXPECT_TRUE(d.ignored.empty()) << d.ignored;
  EXPECT_EQ(d.rows_min_for("int8_rows"), 24);
  EXPECT_EQ(d.rows_min_for("int8_act_all"), std::nullopt);
  std::remove(path.c_str());
}

TEST(DecisionsTest, AnotherCpuOrTierIsIgnoredWithTheReason) {
  const std::string other = write(doc("Other CPU", "avx2", R"({"int8_rows": {"rows_min": 24}})"));
  const MachineDecisions a = read_decisions(other, cpu());
  EXPECT_EQ(a.ignored, "measured on Other CPU, this CPU is " + cpu().model);
  EXPECT_EQ(a.rows_min_for("int8_rows"), std::nullopt);
  const std::string tier = write(doc(cpu().model, "amx", R"({"int8_rows": {"rows_min": 24}})"));
  const MachineDecisions b = read_decisions(tier, cpu());
  EXPECT_EQ(b.ignored, "measured at tier amx, this process runs tier avx2");
  EXPECT_EQ(b.rows_min_for("int8_rows"), std::nullopt);
  std::remove(other.c_str());
  std::remove(tier.c_str());
}

TEST(DecisionsTest, AFileThatIsNotOneThrowsNamingWhy) {
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"not json", "not a JSON object"},
           {R"({"schema": "flashrt-decisions/2"})", "schema is not flashrt-decisions/1"},
           {doc(cpu().model, "avx2", "[]"), "no forms object"},
           {doc(cpu().model, "avx2", R"({"int8_rows": {"rows_min": 2.5}})"),
            "form int8_rows has no integer rows_min"},
           {R"({"schema": 1})", "schema is not flashrt-decisions/1"},
           {doc(cpu().model, "avx2", R"({"int8_rows": {"rows_min": 16}})"),
            "rows_min 16 inside the decode band (1..16)"}}) {
    const std::string path = write(text);
    try {
      read_decisions(path, cpu());
      ADD_FAILURE() << "accepted: " << text;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
    std::remove(path.c_str());
  }
  EXPECT_THROW(read_decisions("/nonexistent/decisions.json", cpu()), InvalidArgument);
}

}  // namespace
}  // namespace frt
