#include "client/tuttictl/output.h"

#include "gtest/gtest.h"

namespace tutti::tuttictl {
namespace {

TEST(TableTest, AlignsColumns) {
  Table t({"NAME", ">COUNT", "NOTE"});
  t.AddRow({"a", "5", "x"});
  t.AddRow({"longer", "12345"});
  EXPECT_EQ(t.Render(),
            "NAME    COUNT  NOTE\n"
            "a           5  x\n"
            "longer  12345  \n");
}

TEST(KeyValuesTest, PadsKeys) {
  KeyValues kv;
  kv.Add("a", "1");
  kv.Add("long key", "2");
  EXPECT_EQ(kv.Render(), "a         1\nlong key  2\n");
}

TEST(JsonWriterTest, NestsAndEscapes) {
  JsonWriter j;
  j.BeginObject().Key("n").Uint(18446744073709551615ull).Key("s").String("a\"b\\c\n\x01");
  j.Key("arr").BeginArray().Uint(1).BeginObject().Key("x").Bool(true).EndObject().Double(0.5);
  j.EndArray().Key("empty").BeginArray().EndArray().EndObject();
  EXPECT_EQ(j.str(),
            "{\"n\":18446744073709551615,\"s\":\"a\\\"b\\\\c\\n\\u0001\","
            "\"arr\":[1,{\"x\":true},0.5],\"empty\":[]}");
}

TEST(HumanTest, Units) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(256ull << 20), "256.0 MiB");
  EXPECT_EQ(HumanBytes(3ull << 40), "3.0 TiB");
  EXPECT_EQ(HumanDurationMs(45), "45ms");
  EXPECT_EQ(HumanDurationMs(12300), "12.3s");
  EXPECT_EQ(HumanDurationMs(3723004), "1h02m03s");
  EXPECT_EQ(Percent(1, 8), "12.5%");
  EXPECT_EQ(Percent(1, 0), "-");
  EXPECT_EQ(NamespaceHex(0xab), "0x00000000000000ab");
}

}  // namespace
}  // namespace tutti::tuttictl
