#include "cli/table.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

TEST(TextTableTest, ColumnsArePaddedToTheWidestCellWithTwoSpaces) {
  TextTable table({"NAME", "ROWS", "PS"});
  table.AddRow({"dense/kernel/0", "[0, 392)", "ps:0"});
  table.AddRow({"b", "[0, 10)", "ps:1"});
  EXPECT_EQ(table.ToString(),
            "NAME            ROWS      PS\n"
            "dense/kernel/0  [0, 392)  ps:0\n"
            "b               [0, 10)   ps:1\n");
}

TEST(TextTableTest, TheLastColumnIsNotPaddedAndEmptyCellsKeepTheirPlace) {
  TextTable table({"A", "DETAIL"});
  table.AddRow({"", "x"});
  table.AddRow({"long cell", ""});
  EXPECT_EQ(table.ToString(),
            "A          DETAIL\n"
            "           x\n"
            "long cell  \n");
}

TEST(TextTableTest, AHeaderAloneIsOneLine) { EXPECT_EQ(TextTable({"ONLY"}).ToString(), "ONLY\n"); }

TEST(TextTableDeathTest, ARowOfTheWrongWidthIsAProgrammerError) {
  TextTable table({"A", "B"});
  EXPECT_DEATH(table.AddRow({"1"}), "");
}

}  // namespace
}  // namespace pscluster
