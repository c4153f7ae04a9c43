//! ringcast (under construction).
