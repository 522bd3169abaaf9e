// The parametrised cases of the schedule tests: one schedule at one shape (p stages, v chunks per
// stage, m micro-batches), with readable gtest names ("interleaved_p4_v2_m8").
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "engine/schedule/schedule.h"

namespace llmt::testing_cases {

struct Case {
  PipeSchedule kind;
  int p, v, m;
};

inline void PrintTo(const Case& c, std::ostream* os) {
  *os << schedule_name(c.kind) << " p=" << c.p << " v=" << c.v << " m=" << c.m;
}

inline std::string case_name(const testing::TestParamInfo<Case>& info) {
  std::string n = schedule_name(info.param.kind);
  for (char& c : n)
    if (c == '-') c = '_';
  return n + "_p" + std::to_string(info.param.p) + "_v" + std::to_string(info.param.v) + "_m" +
         std::to_string(info.param.m);
}

// Every schedule x p in `ps` x m in {p, 2p, 4p}; interleaved once per v in `interleaved_vs`, ZB-V
// and DualPipeV with their two chunks per rank (DualPipeV where m >= 2p-1: p = 1 and m >= 2p).
inline std::vector<Case> schedule_cases(std::initializer_list<int> ps,
                                        std::initializer_list<int> interleaved_vs) {
  std::vector<Case> cases;
  for (int p : ps) {
    for (int m : {p, 2 * p, 4 * p}) {
      cases.push_back({PipeSchedule::gpipe, p, 1, m});
      cases.push_back({PipeSchedule::one_f_one_b, p, 1, m});
      for (int v : interleaved_vs) cases.push_back({PipeSchedule::interleaved, p, v, m});
      cases.push_back({PipeSchedule::zb_h1, p, 1, m});
      cases.push_back({PipeSchedule::zb_v, p, 2, m});
      if (m >= 2 * p - 1) cases.push_back({PipeSchedule::dualpipe_v, p, 2, m});
    }
  }
  return cases;
}

}  // namespace llmt::testing_cases
